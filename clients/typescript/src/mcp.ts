// An MCP server's side of the acp-connector sidecar (/v1), for MCP servers in TypeScript on any MCP SDK: the same
// decisions as the connector's Python MCP face (`service/mcp/`), with the MCP wire left to the server's SDK through
// a small `McpPeer` (what the package needs of the client's connection). What differs from ACP:
// - URL mode counts only as an explicit `elicitation.url` object, and an empty `elicitation: {}` means form only
//   (MCP's compatibility rule; ACP reads `{}` as no mode at all): such a client gets `unsupported`, never a form;
// - the completion is `notifications/elicitation/complete` `{elicitationId}` (ACP: `elicitation/complete`);
// - the alternative to asking on the call: the tool call fails with `-32042` (URL elicitation required) whose `data`
//   is `{elicitations: [{mode: "url", message, url, elicitationId}]}`; the completion then goes out on the connection
//   when the browser is done, and the client calls the tool again (a stored grant answers it).
// Nothing here imports an MCP SDK or the ACP SDK: `@acp-connector/client/mcp` needs neither.
import { SidecarApi, type SidecarOptions } from "./api.js";
import { createBody, ElicitationCalls, readAnswer, settledOutcome, type Ask, type Created } from "./asks.js";
import { ClientNotInitialized } from "./errors.js";
import { AuthorizationOutcome } from "./outcomes.js";
import type { Backoff } from "./retry.js";
import type { Answer, ElicitationState, StopCause, User } from "./types.js";

/** MCP's completion notification (2025-11-25); ACP's method is `elicitation/complete`. */
export const ELICITATION_COMPLETE = "notifications/elicitation/complete";
/** The JSON-RPC error code a tool call answers when the user must first finish a URL elicitation (2025-11-25). */
export const URL_ELICITATION_REQUIRED = -32042;

/** The params of a URL-mode `elicitation/create` (and an entry of the -32042 error's `elicitations`). */
export type UrlElicitation = { mode: "url"; message: string; url: string; elicitationId: string };
export type CompletionNotification = { method: typeof ELICITATION_COMPLETE; params: { elicitationId: string } };
/** The `data` of the -32042 error. */
export type UrlElicitationRequiredData = { elicitations: UrlElicitation[] };

/** Whether an MCP client advertised URL-mode elicitation: only an explicit `url` object counts (`{}` is form only). */
export function urlModeAdvertised(capabilities: { elicitation?: unknown } | null | undefined): boolean {
  const elicitation = capabilities?.elicitation;
  if (typeof elicitation !== "object" || elicitation === null || Array.isArray(elicitation)) return false;
  const url = (elicitation as Record<string, unknown>).url;
  return typeof url === "object" && url !== null && !Array.isArray(url);
}

export function completionNotification(elicitationId: string): CompletionNotification {
  return { method: ELICITATION_COMPLETE, params: { elicitationId } };
}

export function urlElicitationRequiredData(elicitation: UrlElicitation): UrlElicitationRequiredData {
  return { elicitations: [elicitation] };
}

/** What `requireAuthorization` throws: answer the tool call with JSON-RPC error `code` (-32042) and `data`. */
export class UrlElicitationRequired extends Error {
  override readonly name = "UrlElicitationRequired";
  readonly code = URL_ELICITATION_REQUIRED;
  constructor(readonly elicitation: UrlElicitation) {
    super("The user must authorize in the browser first: open the URL, then call the tool again.");
  }

  get data(): UrlElicitationRequiredData {
    return urlElicitationRequiredData(this.elicitation);
  }
}

/** The client's connection, as the server's MCP SDK serves it. The package sends nothing on its own. */
export type McpPeer = {
  /** A key of this connection (one MCP session), unique in the server: the sidecar ties the elicitation to it. */
  readonly connectionId: string;
  /** What the client advertised in `initialize` (undefined before it did). */
  capabilities(): { elicitation?: unknown } | undefined;
  /** Send `elicitation/create` with `params` on the tool call's stream and answer the client's result; aborting
   * `signal` withdraws it (`notifications/cancelled`). */
  elicit(params: UrlElicitation, signal: AbortSignal): Promise<Record<string, unknown>>;
  /** Send `notification`: with `duringCall`, on the tool call's own stream (it is still open); else on the
   * connection (the -32042 path, whose call has answered). */
  notify(notification: CompletionNotification, duringCall: boolean): Promise<void>;
  /** Aborted when the connection closes. */
  readonly closed?: AbortSignal;
};

export type McpAuthorizationRequest = Omit<Ask, "scope"> & {
  /** The JSON-RPC id of the tool call being served (the elicitation's scope at the sidecar). */
  requestId: string | number;
  /** The tool call's cancellation (the client's `notifications/cancelled`, or the connection closing). */
  signal?: AbortSignal;
};

/** What the decisions before asking need of the client: its connection key and capabilities. */
type Client = Pick<McpPeer, "connectionId" | "capabilities">;

/** The key of the one input request of a 2026-07-28 round (in `inputRequests` and `inputResponses`). */
export const INPUT_REQUEST_KEY = "authorization";
/** How long an unanswered round is kept at most (its elicitation expires sooner, by the sidecar's settings). */
const ROUND_MS = 24 * 3600 * 1000;

/** 2026-07-28: the input request of an `input_required` result (no `elicitationId`; no completion exists). */
export type UrlInputRequest = {
  method: "elicitation/create";
  params: { mode: "url"; message: string; url: string };
};
/** What the tool returns on a 2026-07-28 call instead of its result: `resultType: "input_required"` with these. */
export type InputRequired = { inputRequests: { [INPUT_REQUEST_KEY]: UrlInputRequest }; requestState: string };
/** What the client sent with a 2026-07-28 call: the echoed `requestState` and its `inputResponses`, if any. */
export type RoundCall = { requestState?: string | undefined; inputResponses?: Record<string, unknown> | undefined };

type Round = {
  created: Created;
  user: User;
  provider: string;
  ended: Promise<ElicitationState>;
  stop: AbortController;
};
type AskResult = { answer: Answer } | { failed: unknown };

export class McpConnector {
  readonly api: SidecarApi;
  private readonly backoff: Backoff | undefined;
  private readonly calls: ElicitationCalls;
  private readonly watches = new Set<AbortController>();
  private readonly rounds = new Map<string, Round>();

  constructor(options: SidecarOptions & { backoff?: Backoff }) {
    this.api = new SidecarApi(options);
    this.backoff = options.backoff;
    this.calls = new ElicitationCalls(this.api, this.backoff);
  }

  /**
   * Make sure `request.user` holds a grant at `request.provider`, asking the client on the tool call: stored grants
   * first; a client without URL mode gets `unsupported`; else `elicitation/create` (URL mode) goes out, and the
   * outcome comes with the client's `decline` / `cancel`, with the end of the elicitation, or after `accept` when
   * the user finishes in the browser (`notifications/elicitation/complete` is sent once, on the tool call's
   * stream). A cancelled tool call ends the elicitation at the sidecar and throws `AuthorizationCancelled`.
   */
  async requestAuthorization(peer: McpPeer, request: McpAuthorizationRequest): Promise<AuthorizationOutcome> {
    const answered = await this.withoutAsking(peer, request);
    if (answered !== undefined) return answered;
    const created = await this.create(peer, request);
    if (created instanceof AuthorizationOutcome) return created;
    const stop = AbortSignal.any([request.signal, peer.closed].filter((s): s is AbortSignal => s !== undefined));
    const watching = new AbortController();
    // Watched before elicitation/create goes out: nothing can end the elicitation unseen.
    const ended = this.calls.ended(created, AbortSignal.any([stop, watching.signal]));
    ended.catch(() => undefined); // read below, or abandoned when something else decided
    try {
      return await this.elicit(peer, created, ended, stop);
    } finally {
      watching.abort();
    }
  }

  /**
   * As `requestAuthorization`, but instead of asking on the call it throws `UrlElicitationRequired` (the server
   * answers the tool call with -32042 and its `data`); when the user finishes in the browser,
   * `notifications/elicitation/complete` goes out once on the connection, and the client's retry finds the grant.
   */
  async requireAuthorization(peer: McpPeer, request: McpAuthorizationRequest): Promise<AuthorizationOutcome> {
    const answered = await this.withoutAsking(peer, request);
    if (answered !== undefined) return answered;
    const created = await this.create(peer, request);
    if (created instanceof AuthorizationOutcome) return created;
    const watch = new AbortController();
    this.watches.add(watch);
    const stop = AbortSignal.any([watch.signal, ...(peer.closed ? [peer.closed] : [])]);
    this.calls
      .ended(created, stop)
      .then((end) => this.told(peer, AuthorizationOutcome.of(end), false))
      .catch(() => undefined) // the connection closed, or the connector was closed: nobody to tell
      .finally(() => this.watches.delete(watch));
    throw new UrlElicitationRequired(elicitationParams(created));
  }

  /**
   * The 2026-07-28 input-required round trip (no server-to-client request, no completion notification). The first
   * call answers `InputRequired`: the tool returns it as `resultType: "input_required"`; its one input request is the
   * URL-mode elicitation (no `elicitationId`) and its `requestState` a random token naming the round in this
   * process. The retry (same tool, the token echoed, the client's answer in `inputResponses.authorization`) reports
   * the answer; after `accept` it waits for the browser and answers the outcome. Stored grants and the client's
   * capabilities (`client.capabilities()`: this request's) are looked at first, as on the other paths. Retries must
   * reach the process that answered the first call.
   */
  async round(
    client: Client,
    request: McpAuthorizationRequest,
    call: RoundCall,
  ): Promise<AuthorizationOutcome | InputRequired> {
    const token = call.requestState ?? "";
    const open = this.rounds.get(token);
    if (open === undefined || open.user.issuer !== request.user.issuer || open.user.subject !== request.user.subject) {
      return this.firstRound(client, request);
    }
    if (open.provider !== request.provider) return this.firstRound(client, request);
    const response = call.inputResponses?.[INPUT_REQUEST_KEY];
    if (typeof response !== "object" || response === null) return question(token, open.created); // ask again
    const answer = readAnswer(response as Record<string, unknown>);
    const state = await this.calls.report(open.created, answer);
    if (answer.action !== "accept") {
      this.dropRound(token);
      return AuthorizationOutcome.of(state);
    }
    const signal = request.signal ?? new AbortController().signal;
    const stopped = new Promise<"stopped">((resolve) => {
      if (signal.aborted) resolve("stopped");
      signal.addEventListener("abort", () => resolve("stopped"), { once: true });
    });
    try {
      const end = await Promise.race([open.ended, stopped]);
      if (end === "stopped")
        throw await this.calls.stopped(open.created.elicitationId, "client_cancel_request", undefined);
      return AuthorizationOutcome.of(end); // the result tells it: no completion notification at 2026-07-28
    } finally {
      this.dropRound(token);
    }
  }

  private async firstRound(
    client: Client,
    request: McpAuthorizationRequest,
  ): Promise<AuthorizationOutcome | InputRequired> {
    const answered = await this.withoutAsking(client, request);
    if (answered !== undefined) return answered;
    this.expireRounds();
    const token = randomToken();
    // No connection outlives a 2026-07-28 call: the key only names the round.
    const created = await this.create({ ...client, connectionId: `mcp-round-${token.slice(0, 16)}` }, request);
    if (created instanceof AuthorizationOutcome) return created;
    const stop = new AbortController();
    // Followed from its creation: a browser that finishes before the client retries is not missed.
    const ended = this.calls.ended(created, stop.signal);
    ended.catch(() => undefined);
    this.rounds.set(token, { created, user: request.user, provider: request.provider, ended, stop });
    return question(token, created);
  }

  private dropRound(token: string): void {
    this.rounds.get(token)?.stop.abort();
    this.rounds.delete(token);
  }

  /** Forget rounds nobody came back to: their elicitation has expired (or a day has passed). */
  private expireRounds(): void {
    const now = Date.now();
    for (const [token, open] of this.rounds) {
      if (open.created.expiresAt.getTime() < now || open.created.expiresAt.getTime() - now > ROUND_MS) {
        this.dropRound(token);
      }
    }
  }

  /** A provider API call through the sidecar's token proxy: the token is added there, never seen here. */
  fetch(user: User, provider: string, path: string, init?: RequestInit): Promise<Response> {
    return this.api.proxy(user, provider, path, init);
  }

  /** Stop following the elicitations of -32042 answers (no completion goes out for them any more) and forget the
   * open 2026-07-28 rounds. */
  close(): void {
    for (const watch of this.watches) watch.abort();
    this.watches.clear();
    for (const token of [...this.rounds.keys()]) this.dropRound(token);
  }

  /** What stored grants answer, or `unsupported` for a client without URL mode; undefined: ask the client. */
  private async withoutAsking(
    peer: Client,
    request: McpAuthorizationRequest,
  ): Promise<AuthorizationOutcome | undefined> {
    const body = createBody({ ...request, scope: { requestId: request.requestId } });
    const settled = await this.api.createElicitation({ ...body, grantsOnly: true });
    if (settled.status === "already_authorized" || settled.status === "narrowed") {
      return settledOutcome(request.provider, settled.status, settled);
    }
    const capabilities = peer.capabilities();
    if (capabilities === undefined) throw new ClientNotInitialized();
    if (urlModeAdvertised(capabilities)) return undefined;
    const recorded = await this.api.createElicitation({ ...body, urlMode: false });
    if (recorded.status === "already_authorized" || recorded.status === "narrowed") {
      return settledOutcome(request.provider, recorded.status, recorded);
    }
    return new AuthorizationOutcome("unsupported", request.provider, settled.providerDisplayName);
  }

  private async create(peer: Client, request: McpAuthorizationRequest): Promise<Created | AuthorizationOutcome> {
    const body = createBody({ ...request, scope: { requestId: request.requestId } });
    // The idempotency key makes a repeated POST (after a lost answer) answer with the same elicitation.
    const created = await this.api.createElicitation({ ...body, connectionId: peer.connectionId }, crypto.randomUUID());
    if (created.status !== "created") return settledOutcome(request.provider, created.status, created);
    return {
      elicitationId: created.elicitationId ?? "",
      url: created.url ?? "",
      message: created.message ?? "",
      expiresAt: new Date(created.expiresAt ?? Date.now()),
    };
  }

  private async elicit(
    peer: McpPeer,
    created: Created,
    ended: Promise<ElicitationState>,
    stop: AbortSignal,
  ): Promise<AuthorizationOutcome> {
    const cause = (): StopCause => (peer.closed?.aborted ? "client_disconnected" : "client_cancel_request");
    const withdraw = new AbortController(); // aborting it withdraws the create while it is unanswered
    const asked: Promise<AskResult> = peer
      .elicit(elicitationParams(created), AbortSignal.any([stop, withdraw.signal]))
      .then(
        (result) => ({ answer: readAnswer(result) }),
        (error: unknown) => ({ failed: error }),
      );
    let first: AskResult | { end: ElicitationState };
    try {
      first = await Promise.race([asked, ended.then((end) => ({ end }))]);
    } catch (error) {
      if (!stop.aborted) {
        withdraw.abort(); // the wait failed (the sidecar stayed away past the expiry): the question is moot
        throw error;
      }
      first = await asked;
    }
    if ("end" in first) {
      withdraw.abort(); // it ended first (expired, cancelled, or the browser was faster): the question is withdrawn
      return this.told(peer, AuthorizationOutcome.of(first.end), true);
    }
    if (stop.aborted)
      throw await this.calls.stopped(created.elicitationId, cause(), "failed" in first ? true : undefined);
    const answer: Answer =
      "answer" in first ? first.answer : { action: "client_error", code: errorCode(first.failed) ?? -32603 };
    const state = await this.calls.report(created, answer);
    if (answer.action !== "accept") return AuthorizationOutcome.of(state);
    // Accepted: consent to open the URL. Now the browser decides; or the tool call stops.
    const stopped = new Promise<"stopped">((resolve) => {
      if (stop.aborted) resolve("stopped");
      stop.addEventListener("abort", () => resolve("stopped"), { once: true });
    });
    const end = await Promise.race([ended, stopped]).catch((error: unknown) => {
      if (stop.aborted) return "stopped" as const;
      throw error;
    });
    if (end === "stopped") throw await this.calls.stopped(created.elicitationId, cause(), undefined);
    return this.told(peer, AuthorizationOutcome.of(end), true);
  }

  /** Tell the client once that the elicitation completed (authorized or narrowed). */
  private async told(peer: McpPeer, outcome: AuthorizationOutcome, duringCall: boolean): Promise<AuthorizationOutcome> {
    if (outcome.completed && outcome.elicitationId !== undefined) {
      await peer.notify(completionNotification(outcome.elicitationId), duringCall);
    }
    return outcome;
  }
}

/** The params of the URL-mode `elicitation/create` for an elicitation the sidecar created. */
export function elicitationParams(created: { elicitationId: string; url: string; message: string }): UrlElicitation {
  return { mode: "url", message: created.message, url: created.url, elicitationId: created.elicitationId };
}

/** The input-required answer of a round: the URL-mode elicitation without its id, and the round's token. */
export function inputRequest(created: { url: string; message: string }): UrlInputRequest {
  return { method: "elicitation/create", params: { mode: "url", message: created.message, url: created.url } };
}

function question(token: string, created: Created): InputRequired {
  return { inputRequests: { [INPUT_REQUEST_KEY]: inputRequest(created) }, requestState: token };
}

function randomToken(): string {
  return Buffer.from(crypto.getRandomValues(new Uint8Array(32))).toString("base64url");
}

function errorCode(error: unknown): number | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === "number" ? code : undefined;
}

export { AuthorizationCancelled, ClientNotInitialized, SidecarError } from "./errors.js";
export { AuthorizationOutcome } from "./outcomes.js";
export type { AuthorizationStatus, ElicitationState, Grant, User } from "./types.js";
