// Trying a sidecar call again while the sidecar cannot be reached (restarting, or the network failing), until a
// deadline: the elicitation's expiry.
import { SidecarError, SidecarUnavailableError } from "./errors.js";

export type Backoff = { firstMs: number; maxMs: number };
export const DEFAULT_BACKOFF: Backoff = { firstMs: 100, maxMs: 2000 };

/** What went wrong, in words, when `error` means the sidecar could not be reached; undefined when it answered. */
export function unreachable(error: unknown): string | undefined {
  if (error instanceof SidecarError) {
    return [502, 503, 504].includes(error.status) ? `it answered HTTP ${error.status} (unavailable)` : undefined;
  }
  if (error instanceof TypeError) {
    // fetch rejects with a TypeError ("fetch failed") whose cause names the network error.
    const code = (error.cause as { code?: unknown } | undefined)?.code;
    if (code === "ECONNREFUSED") return "it refused the connection";
    if (code === "ECONNRESET" || code === "UND_ERR_SOCKET") return "the connection to it broke";
    return "it could not be reached";
  }
  return undefined;
}

function clock(moment: Date): string {
  return `${moment.toISOString().slice(11, 19)} UTC`;
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason as Error);
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason as Error);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * `attempt()`, tried again with backoff (doubling, with jitter) while the sidecar cannot be reached, until
 * `expiresAt`; then `SidecarUnavailableError`. An answer of the sidecar, also a refusal, ends the retrying, and so
 * does `signal` (its reason is thrown).
 */
export async function untilExpiry<T>(
  attempt: () => Promise<T>,
  options: { expiresAt: Date; baseUrl: string; signal?: AbortSignal; backoff?: Backoff },
): Promise<T> {
  const { firstMs, maxMs } = options.backoff ?? DEFAULT_BACKOFF;
  let delay = firstMs;
  let downSince: Date | undefined;
  for (;;) {
    try {
      return await attempt();
    } catch (error) {
      options.signal?.throwIfAborted();
      const what = unreachable(error);
      if (what === undefined) throw error;
      const now = new Date();
      downSince ??= now;
      const remaining = options.expiresAt.getTime() - now.getTime();
      if (remaining <= 0) {
        throw new SidecarUnavailableError(
          `The connector at ${options.baseUrl} could not be reached since ${clock(downSince)} (${what}), and the ` +
            `request for access expired at ${clock(options.expiresAt)}: the authorization did not complete. ` +
            "Ask again once the connector is back.",
          downSince,
          options.expiresAt,
          { cause: error },
        );
      }
      await sleep(Math.min(delay * (0.5 + Math.random() / 2), remaining), options.signal);
      delay = Math.min(delay * 2, maxMs);
    }
  }
}
