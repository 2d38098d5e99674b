// The agent's calls, as the Python connector's (`Connector` embedded, `SidecarClient` over /v1): attach a
// connection, request a user's authorization over it, find and use grants through the proxy, disconnect. It owns
// the ACP side as `AcpAuthorizer` does: URL-mode check, `elicitation/create`, the client's answer reported with its
// reason, `$/cancel_request` when the elicitation ends first or the turn is cancelled, `elicitation/complete` once,
// a cancellation reported with its cause.
import type { AgentApp, Stream } from "@agentclientprotocol/sdk";

import { SidecarApi, type SidecarOptions } from "./api.js";
import { createBody, ElicitationCalls, readAnswer, settledOutcome, type Created } from "./asks.js";
import { ClientNotInitialized } from "./errors.js";
import { events, type EventOptions, type StreamedEvent } from "./events.js";
import { AcpLink } from "./link.js";
import { AuthorizationOutcome } from "./outcomes.js";
import type { Backoff } from "./retry.js";
import type { Answer, ElicitationState, Grant, Scope, StopCause, User } from "./types.js";

export type AuthorizationRequest = {
  /** The user the agent acts for, as the agent's own sign-in verified them. */
  user: User;
  /** The provider's name in the sidecar's catalog. */
  provider: string;
  /** Scopes to ask for (default: the provider's default scopes). */
  scopes?: string[];
  /** Where the elicitation belongs: `{sessionId, toolCallId?}` (the turn's cancellation then applies) or `{requestId}`. */
  scope: Scope;
  /** What the client shows the user (default: a sentence naming the provider). */
  message?: string;
  /** Ask the user even when a stored grant lacks only scopes the provider refused before. */
  askAgain?: boolean;
  /** Per-connection values the provider's catalog entry asks of the agent (e.g. `{subdomain: "acme"}`); a missing or
   * malformed one is refused (`missing_connection_value` / `invalid_connection_value`) before anyone is asked. */
  connection?: Record<string, string>;
  /** Which of the user's accounts at the provider (work and personal): its account id or the label the user gave it.
   * Required when the user holds several there (else `SidecarError` `account_choice_needed`, its `labels` naming
   * them); one not held yet asks the user to add it. */
  account?: string;
  /** The agent's own cancellation (a timeout, its work stopping): the elicitation ends with cause `agent`. */
  signal?: AbortSignal;
};

type AskResult = { answer: Answer } | { failed: unknown };

const REQUEST_CANCELLED = -32800;

function errorCode(error: unknown): number | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === "number" ? code : undefined;
}

export type ConnectorOptions = SidecarOptions & { backoff?: Backoff };

export class SidecarConnector {
  readonly api: SidecarApi;
  private readonly backoff: Backoff | undefined;
  private readonly calls: ElicitationCalls;

  constructor(options: ConnectorOptions) {
    this.api = new SidecarApi(options);
    this.backoff = options.backoff;
    this.calls = new ElicitationCalls(this.api, this.backoff);
  }

  /**
   * Connect `app` over `stream` through a link that sees every message first (`app.connect` is called here).
   * Use `link.connection` as the connection, `link.turn(...)` around a prompt's work.
   */
  attach(app: AgentApp, stream: Stream): AcpLink {
    return new AcpLink(app, stream);
  }

  /**
   * Make sure `user` holds a grant at `provider` covering `scopes`, asking through the client on `link` if needed.
   *
   * Stored grants answer first (`already_authorized`, or `narrowed` when a grant lacks only scopes the provider
   * refused); then a client without URL-mode elicitation gets `unsupported` (nothing is sent, never a form). Else
   * the sidecar creates the elicitation and the client receives `elicitation/create`; the outcome comes when the
   * client declines or dismisses it, when the user finishes in the browser (`elicitation/complete` is sent once),
   * or when it expires. Waiting survives sidecar restarts: the sidecar is asked again with backoff until the
   * elicitation's expiry, then `SidecarUnavailableError` (its message is for the user). A cancelled turn
   * (`session/cancel`, `$/cancel_request` for the prompt), `request.signal` or the connection closing end the
   * elicitation at the sidecar with that cause and throw `AuthorizationCancelled`.
   */
  async requestAuthorization(link: AcpLink, request: AuthorizationRequest): Promise<AuthorizationOutcome> {
    const body = createBody(request);
    const settled = await this.api.createElicitation({ ...body, grantsOnly: true });
    if (settled.status === "already_authorized" || settled.status === "narrowed") {
      return settledOutcome(request.provider, settled.status, settled);
    }
    if (link.clientCapabilities === undefined) throw new ClientNotInitialized();
    if (link.closed) return new AuthorizationOutcome("disconnected", request.provider, settled.providerDisplayName);
    if (!link.urlMode) {
      const recorded = await this.api.createElicitation({ ...body, urlMode: false });
      if (recorded.status === "already_authorized" || recorded.status === "narrowed") {
        return settledOutcome(request.provider, recorded.status, recorded);
      }
      return new AuthorizationOutcome("unsupported", request.provider, settled.providerDisplayName);
    }
    // The idempotency key makes a repeated POST (after a lost answer) answer with the same elicitation.
    const created = await this.api.createElicitation({ ...body, connectionId: link.key }, crypto.randomUUID());
    if (created.status !== "created") return settledOutcome(request.provider, created.status, created);
    const elicitation: Created = {
      elicitationId: created.elicitationId ?? "",
      url: created.url ?? "",
      message: created.message ?? "",
      expiresAt: new Date(created.expiresAt ?? Date.now()),
    };
    const turn =
      "sessionId" in request.scope && request.scope.sessionId ? link.turnSignal(request.scope.sessionId) : undefined;
    const stops = [link.signal, turn, request.signal].filter((s): s is AbortSignal => s !== undefined);
    const stop = AbortSignal.any(stops);
    const cause = (): StopCause => {
      if (link.closed) return "client_disconnected";
      if (turn?.aborted) return turn.reason as StopCause;
      return "agent";
    };
    // Watched before elicitation/create goes out: nothing can end the elicitation unseen.
    const watching = new AbortController();
    const ended = this.calls.ended(elicitation, AbortSignal.any([stop, watching.signal]));
    ended.catch(() => undefined); // read below, or abandoned when something else decided
    try {
      return await this.elicit(link, request, elicitation, ended, stop, cause);
    } finally {
      watching.abort();
    }
  }

  private async elicit(
    link: AcpLink,
    request: AuthorizationRequest,
    created: Created,
    ended: Promise<ElicitationState>,
    stop: AbortSignal,
    cause: () => StopCause,
  ): Promise<AuthorizationOutcome> {
    const id = created.elicitationId;
    const withdraw = new AbortController(); // aborting it sends $/cancel_request while the create is unanswered
    const asked = this.ask(link, request.scope, created, AbortSignal.any([stop, withdraw.signal]));
    let first: AskResult | { end: ElicitationState };
    try {
      first = await Promise.race([asked, ended.then((end) => ({ end }))]);
    } catch (error) {
      if (!stop.aborted) {
        withdraw.abort(); // the wait failed (the sidecar stayed away past the expiry): the question is moot
        throw error;
      }
      first = await asked; // the work stopped: the create was withdrawn, or the client's answer came first
    }
    if ("end" in first) {
      // It ended before the client answered (expired or cancelled at the sidecar, or the browser was faster): the
      // question is no longer relevant to the client.
      withdraw.abort();
      return this.delivered(link, AuthorizationOutcome.of(first.end));
    }
    if ("failed" in first) {
      if (!stop.aborted) throw first.failed;
      const withdrawn = !link.closed && errorCode(first.failed) === REQUEST_CANCELLED;
      throw await this.calls.stopped(id, cause(), withdrawn);
    }
    if (stop.aborted) {
      // The client answered, but the turn was already cancelled: the cancellation is what ended the work.
      throw await this.calls.stopped(id, cause(), false);
    }
    const state = await this.calls.report(created, first.answer);
    if (first.answer.action !== "accept") return AuthorizationOutcome.of(state);
    // Accepted. Now the browser: wait for the end, or for the work to stop.
    const stopped = new Promise<"stopped">((resolve) => {
      if (stop.aborted) resolve("stopped");
      stop.addEventListener("abort", () => resolve("stopped"), { once: true });
    });
    const end = await Promise.race([ended, stopped]).catch((error: unknown) => {
      if (stop.aborted) return "stopped" as const; // the wait was stopped with the work
      throw error;
    });
    if (end === "stopped") throw await this.calls.stopped(id, cause(), undefined);
    return this.delivered(link, AuthorizationOutcome.of(end));
  }

  /** Send `elicitation/create`; the client's answer as the sidecar takes it, or why none came. */
  private async ask(link: AcpLink, scope: Scope, created: Created, cancel: AbortSignal): Promise<AskResult> {
    const where =
      scope.requestId !== undefined && scope.requestId !== null
        ? { requestId: scope.requestId }
        : { sessionId: scope.sessionId ?? "", ...(scope.toolCallId ? { toolCallId: scope.toolCallId } : {}) };
    const params = {
      mode: "url",
      elicitationId: created.elicitationId,
      url: created.url,
      message: created.message,
      ...where,
    };
    try {
      // Aborting `cancel` sends $/cancel_request for this request and stops waiting for its answer.
      const response = await link.client.request<Record<string, unknown>>("elicitation/create", params, {
        cancellationSignal: cancel,
        stopWaitingOnCancel: true,
      });
      return { answer: readAnswer(response) };
    } catch (error) {
      if (cancel.aborted) return { failed: error };
      if (link.closed) return { answer: { action: "disconnected" } }; // no answer came: the connection closed
      const code = errorCode(error) ?? -32603;
      return { answer: { action: "client_error", code } };
    }
  }

  /** Tell the client once that the elicitation completed (authorized or narrowed). */
  private async delivered(link: AcpLink, outcome: AuthorizationOutcome): Promise<AuthorizationOutcome> {
    if (outcome.completed && outcome.elicitationId !== undefined) await link.complete(outcome.elicitationId);
    return outcome;
  }

  /** A stored grant of `user` at `provider` covering `scopes`, if there is one (never a token). */
  async findGrant(user: User, provider: string, scopes: string[] = []): Promise<Grant | undefined> {
    const grants = await this.api.grants(user, provider);
    return grants.find((grant) => scopes.every((scope) => grant.scopes.includes(scope)));
  }

  /** A provider API call through the sidecar's token proxy (`path` relative to the provider's API base); `account`
   * names which of the user's accounts there (needed when the user holds several: else a 409). */
  fetch(user: User, provider: string, path: string, init?: RequestInit, account?: string): Promise<Response> {
    return this.api.proxy(user, provider, path, init, account);
  }

  /** `fetch` bound to one user, provider and (optionally) account. */
  http(user: User, provider: string, account?: string): (path: string, init?: RequestInit) => Promise<Response> {
    return (path, init) => this.api.proxy(user, provider, path, init, account);
  }

  /** Revoke (where the provider allows) and delete every grant of `user` at `provider`; how many there were. */
  async disconnect(user: User, provider: string): Promise<number> {
    const grants = await this.api.grants(user, provider);
    for (const grant of grants) await this.api.deleteGrant(grant.grantId);
    return grants.length;
  }

  /** This API key's elicitation events (SSE), resumed from the last event id after any failure. */
  events(options: EventOptions = {}): AsyncGenerator<StreamedEvent> {
    return events(this.api, { ...(this.backoff ? { backoff: this.backoff } : {}), ...options });
  }
}
