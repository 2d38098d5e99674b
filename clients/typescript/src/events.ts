// The agent's events: the sidecar's Server-Sent-Events stream (resumed from the last event id after a failure or a
// restart, so no event is lost or repeated), and the check of a signed webhook delivery.
import { createHmac, timingSafeEqual } from "node:crypto";

import type { SidecarApi } from "./api.js";
import { SidecarError } from "./errors.js";
import { DEFAULT_BACKOFF, type Backoff } from "./retry.js";
import type { ElicitationEvent } from "./types.js";

export type StreamedEvent = ElicitationEvent;
/**
 * A webhook delivery's body: the Standard Webhooks envelope. `type` is `elicitation.<status>` or a grant event's name
 * (`grant.needs_user`, `grant.recovered`, `grant.revoked`, `grant.deleted`); `timestamp` is when the event was logged
 * (ISO 8601); `data` is the event as the stream sends it (a grant event's fields for a `grant.*` type).
 */
export type WebhookEnvelope = { type: string; timestamp: string; data: StreamedEvent | Record<string, unknown> };
export type EventOptions = {
  /** Resume after this event id (`Last-Event-ID`); default: from the newest event on. */
  lastEventId?: string | number;
  /** Ends the stream. */
  signal?: AbortSignal;
  backoff?: Backoff;
};

/** Elicitation events for this API key, for as long as `signal` lets it; reconnects with backoff after a failure. */
export async function* events(api: SidecarApi, options: EventOptions = {}): AsyncGenerator<StreamedEvent> {
  const { firstMs, maxMs } = options.backoff ?? DEFAULT_BACKOFF;
  let last = options.lastEventId === undefined ? undefined : String(options.lastEventId);
  let delay = firstMs;
  while (!options.signal?.aborted) {
    try {
      const headers: Record<string, string> = { Accept: "text/event-stream" };
      if (last !== undefined) headers["Last-Event-ID"] = last;
      const init: RequestInit = { headers };
      if (options.signal !== undefined) init.signal = options.signal;
      const response = await api.raw("/v1/events", init);
      if (!response.ok || response.body === null) {
        const status = response.status;
        await response.body?.cancel();
        if (status < 500) throw new SidecarError(status, `http_${status}`, `The event stream answered HTTP ${status}.`);
        throw new TypeError(`the event stream answered HTTP ${status}`);
      }
      delay = firstMs;
      for await (const frame of frames(response.body)) {
        if (frame.id !== undefined) last = frame.id;
        if (frame.event === "elicitation" && frame.data !== undefined) yield JSON.parse(frame.data) as StreamedEvent;
      }
    } catch (error) {
      if (options.signal?.aborted) return;
      if (error instanceof SidecarError) throw error; // refused (a bad key, a bad id): trying again changes nothing
    }
    await new Promise((resolve) => setTimeout(resolve, delay * (0.5 + Math.random() / 2)));
    delay = Math.min(delay * 2, maxMs);
  }
}

type Frame = { id?: string; event?: string; data?: string };

/** SSE frames (`id`, `event`, `data`), one per blank-line-terminated block; comments are skipped. */
async function* frames(body: ReadableStream<Uint8Array>): AsyncGenerator<Frame> {
  let buffer = "";
  let frame: Frame = {};
  for await (const chunk of body.pipeThrough(new TextDecoderStream())) {
    buffer += chunk;
    let newline: number;
    while ((newline = buffer.search(/\r\n|\r|\n/)) >= 0) {
      const line = buffer.slice(0, newline);
      buffer = buffer.slice(newline + (buffer.startsWith("\r\n", newline) ? 2 : 1));
      if (line === "") {
        if (frame.data !== undefined || frame.id !== undefined) yield frame;
        frame = {};
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "id") frame.id = value;
      else if (field === "event") frame.event = value;
      else if (field === "data") frame.data = frame.data === undefined ? value : `${frame.data}\n${value}`;
    }
  }
}

export class WebhookVerificationError extends Error {
  override readonly name = "WebhookVerificationError";
}

const SECRET_PREFIX = "whsec_";

function secretKey(secret: string): Buffer {
  if (!secret.startsWith(SECRET_PREFIX)) throw new WebhookVerificationError("a webhook secret starts with whsec_");
  const key = Buffer.from(secret.slice(SECRET_PREFIX.length), "base64");
  if (key.length < 16) throw new WebhookVerificationError("a webhook secret holds at least 16 bytes");
  return key;
}

/**
 * Check a webhook request as the Standard Webhooks specification says (`webhook-id`, `webhook-timestamp`,
 * `webhook-signature`: `v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`, several space-separated while a
 * secret rotation overlaps) and return its body, the envelope. `body` is the raw body as received; `secret` may be
 * several (the new and the previous one). Throws `WebhookVerificationError` when a header is missing, the timestamp
 * is more than `toleranceSeconds` from now (a replay), or no signature matches.
 */
export function verifyWebhook(
  secret: string | string[],
  headers: Headers | Record<string, string | string[] | undefined>,
  body: string | Uint8Array,
  options: { toleranceSeconds?: number; now?: number } = {},
): WebhookEnvelope {
  const header = (name: string): string | undefined => {
    if (headers instanceof Headers) return headers.get(name) ?? undefined;
    const found = Object.entries(headers).find(([key]) => key.toLowerCase() === name.toLowerCase())?.[1];
    return Array.isArray(found) ? found.join(" ") : found;
  };
  const messageId = header("webhook-id");
  const stamp = header("webhook-timestamp");
  const given = header("webhook-signature");
  if (!messageId || !stamp || !given) {
    throw new WebhookVerificationError("a webhook-id, webhook-timestamp or webhook-signature header is missing");
  }
  if (!/^\d{1,12}$/.test(stamp)) throw new WebhookVerificationError("the webhook-timestamp is not a unix time");
  const now = options.now ?? Date.now() / 1000;
  if (Math.abs(now - Number(stamp)) > (options.toleranceSeconds ?? 300)) {
    throw new WebhookVerificationError("the webhook-timestamp is too far from now (a replayed request?)");
  }
  const raw = typeof body === "string" ? Buffer.from(body) : Buffer.from(body);
  const expected = (Array.isArray(secret) ? secret : [secret]).map((each) => {
    const mac = createHmac("sha256", secretKey(each)).update(`${messageId}.${stamp}.`).update(raw).digest("base64");
    return Buffer.from(`v1,${mac}`);
  });
  let matched = false;
  for (const candidate of given.split(/\s+/).filter(Boolean)) {
    const offered = Buffer.from(candidate);
    for (const wanted of expected) {
      // Every pair is compared, so the time taken does not tell which (or whether one) matched.
      matched = (offered.length === wanted.length && timingSafeEqual(offered, wanted)) || matched;
    }
  }
  if (!matched) throw new WebhookVerificationError("no webhook-signature matches the secret");
  let event: unknown;
  try {
    event = JSON.parse(raw.toString("utf8"));
  } catch {
    throw new WebhookVerificationError("the body is not JSON");
  }
  if (typeof event !== "object" || event === null || Array.isArray(event)) {
    throw new WebhookVerificationError("the body is not a JSON object");
  }
  return event as WebhookEnvelope;
}
