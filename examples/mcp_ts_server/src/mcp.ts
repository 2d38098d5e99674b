// What an MCP server adds on top of the /v1 API: the MCP wire (2025-11-25). It decides as the Python face
// (`service/mcp/`, `McpAuthorizer`) does: stored grants first; then only a client that advertised URL mode is asked
// (an empty `elicitation: {}` means form only in MCP, so it is not); `accept` is consent to open the URL, the call
// then waits for the browser; a completed elicitation is told to that client once, with
// `notifications/elicitation/complete` (ACP's method is `elicitation/complete`). The -32042 path instead answers the
// tool call with `UrlElicitationRequiredError` whose data is `{elicitations: [{mode, url, elicitationId, message}]}`.

import { randomUUID } from "node:crypto";
import type { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { UrlElicitationRequiredError, type RequestId } from "@modelcontextprotocol/sdk/types.js";
import type { Ask, Sidecar, State } from "./sidecar.js";

export type Outcome = { status: string; reason?: string | null };
const COMPLETED = new Set(["authorized", "narrowed"]);

/** Whether the client advertised URL-mode elicitation: only an explicit `url` object counts. */
export function urlModeAdvertised(server: Server): boolean {
  const url = (server.getClientCapabilities()?.elicitation as Record<string, unknown> | undefined)?.url;
  return typeof url === "object" && url !== null;
}

export class McpAuthorization {
  // One stdio server process serves one client connection: its key at the sidecar.
  readonly connectionId = `mcp-ts-${randomUUID()}`;

  constructor(
    private readonly server: Server,
    private readonly sidecar: Sidecar,
  ) {}

  /** Settled from stored grants, or `unsupported`, or null: the client must be asked. */
  private async withoutAsking(ask: Ask): Promise<Outcome | null> {
    const settled = await this.sidecar.settled(ask);
    if (settled.status !== "needs_user") return { status: settled.status };
    if (urlModeAdvertised(this.server)) return null;
    const recorded = await this.sidecar.unsupported(ask);
    return { status: recorded.status };
  }

  /** Ask on the tool call's stream and wait for the browser; the completion is told once, before returning. */
  async request(ask: Ask, requestId: RequestId, signal: AbortSignal): Promise<Outcome> {
    const answered = await this.withoutAsking(ask);
    if (answered !== null) return answered;
    const created = await this.sidecar.create(ask, this.connectionId);
    if (created.status !== "created") return { status: created.status };
    const watching = new AbortController();
    const ended = this.sidecar.ended(created.elicitationId, watching.signal);
    ended.catch(() => undefined);
    const asking = new AbortController();
    try {
      const elicit = this.server.elicitInput(
        { mode: "url", message: created.message, url: created.url, elicitationId: created.elicitationId },
        { relatedRequestId: requestId, signal: AbortSignal.any([asking.signal, signal]), timeout: 3_600_000 },
      );
      const first = await Promise.race([elicit.then((r) => ({ answer: r })), ended.then((s) => ({ end: s }))]);
      if ("end" in first) {
        asking.abort(); // the elicitation ended first: the question is withdrawn (notifications/cancelled)
        return this.told(first.end, requestId);
      }
      const action = first.answer.action;
      const state = await this.sidecar.answer(created.elicitationId, { action });
      if (action !== "accept") return { status: state.outcome ?? action, reason: state.reason };
      return this.told(await ended, requestId);
    } catch (error) {
      if (signal.aborted) await this.sidecar.cancel(created.elicitationId, "agent").catch(() => undefined);
      throw error;
    } finally {
      watching.abort();
    }
  }

  /** The -32042 path: throws `UrlElicitationRequiredError`; the completion goes out when the browser is done. */
  async require(ask: Ask): Promise<Outcome> {
    const answered = await this.withoutAsking(ask);
    if (answered !== null) return answered;
    const created = await this.sidecar.create(ask, this.connectionId);
    if (created.status !== "created") return { status: created.status };
    this.sidecar
      .ended(created.elicitationId)
      .then((state) => this.told(state))
      .catch(() => undefined);
    throw new UrlElicitationRequiredError([
      { mode: "url", message: created.message, url: created.url, elicitationId: created.elicitationId },
    ]);
  }

  /** Tell a completed elicitation to this client once: on the tool call's stream, or the connection's. */
  private async told(state: State, requestId?: RequestId): Promise<Outcome> {
    const status = state.outcome ?? state.status;
    if (COMPLETED.has(status)) {
      const options = requestId === undefined ? undefined : { relatedRequestId: requestId };
      await this.server.createElicitationCompletionNotifier(state.elicitationId, options)();
    }
    return { status, reason: state.reason };
  }
}
