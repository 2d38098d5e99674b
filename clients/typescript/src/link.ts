// One ACP connection as the authorizer needs it: every message is seen (in wire order) before the SDK handles it,
// so the client's capabilities, its `session/cancel` and `$/cancel_request` for a prompt, and the connection's end
// are known at once, as the Python connector's `AcpLink` knows them.
import type { AgentApp, AgentConnection, AgentContext, AnyMessage, Stream } from "@agentclientprotocol/sdk";

import type { StopCause } from "./types.js";

type Turn = { requestId: unknown; controller: AbortController };
type Message = { id?: unknown; method?: unknown; params?: unknown; result?: unknown; error?: unknown };

function record(value: unknown): Record<string, unknown> | undefined {
  return typeof value === "object" && value !== null && !Array.isArray(value)
    ? (value as Record<string, unknown>)
    : undefined;
}

export class AcpLink {
  /** The label the sidecar stores as `connectionId` (events carry it back). */
  readonly key: string = crypto.randomUUID();
  /** The SDK's connection, speaking through this link. */
  readonly connection: AgentConnection;
  private initializeParams: Record<string, unknown> | undefined;
  private readonly turns = new Map<string, Turn>(); // the running prompt per session
  private readonly ended = new AbortController();
  private readonly told = new Set<string>(); // elicitation ids whose elicitation/complete was sent

  /** `app.connect(stream)` with every message seen here first. */
  constructor(app: AgentApp, stream: Stream) {
    const incoming = new TransformStream<AnyMessage, AnyMessage>({
      transform: (message, controller) => {
        this.onIncoming(message);
        controller.enqueue(message);
      },
      flush: () => this.onClosed(),
    });
    const outgoing = new TransformStream<AnyMessage, AnyMessage>({
      transform: (message, controller) => {
        this.onOutgoing(message);
        controller.enqueue(message);
      },
    });
    outgoing.readable.pipeTo(stream.writable).catch(() => this.onClosed());
    this.connection = app.connect({
      readable: stream.readable.pipeThrough(incoming),
      writable: outgoing.writable,
    });
    this.connection.closed.then(
      () => this.onClosed(),
      () => this.onClosed(),
    );
  }

  /** Aborted (reason `client_disconnected`) when the connection has ended. */
  get signal(): AbortSignal {
    return this.ended.signal;
  }

  get closed(): boolean {
    return this.ended.signal.aborted;
  }

  /** The client's side of the connection, for requests and notifications. */
  get client(): AgentContext {
    return this.connection.client;
  }

  /** The client's capabilities as its `initialize` sent them; undefined before `initialize`. */
  get clientCapabilities(): Record<string, unknown> | undefined {
    const params = this.initializeParams;
    if (params === undefined) return undefined;
    return record(params.clientCapabilities) ?? record(params.capabilities) ?? {};
  }

  /** Whether the client advertised URL-mode elicitation: only an explicit, non-null `url` object counts. */
  get urlMode(): boolean {
    const url = record(record(this.clientCapabilities?.elicitation)?.url);
    return url !== undefined;
  }

  /**
   * The signal of the prompt running in `sessionId`, aborted with the `StopCause` when the client sends
   * `session/cancel` for the session or `$/cancel_request` for the prompt, or the connection ends.
   */
  turnSignal(sessionId: string): AbortSignal | undefined {
    return this.turns.get(sessionId)?.controller.signal;
  }

  /**
   * Run one prompt's work; its answer, or `{stopReason: "cancelled"}` whenever the turn was cancelled (the work
   * then ends by itself: an authorization under way throws `AuthorizationCancelled`). ACP requires `cancelled` for
   * a cancelled turn, also when the work finished or failed meanwhile.
   */
  async turn<R extends { stopReason: string }>(
    sessionId: string,
    work: (signal: AbortSignal) => Promise<R>,
  ): Promise<R | { stopReason: "cancelled" }> {
    const signal = this.turnSignal(sessionId) ?? new AbortController().signal;
    const cancelled = (): boolean => signal.aborted && signal.reason !== "client_disconnected";
    try {
      const result = await work(signal);
      return cancelled() ? { stopReason: "cancelled" } : result;
    } catch (error) {
      if (cancelled()) return { stopReason: "cancelled" };
      throw error;
    }
  }

  /** Send `elicitation/complete` for `elicitationId`, once per elicitation; false when nothing was sent. */
  async complete(elicitationId: string): Promise<boolean> {
    if (this.closed || this.told.has(elicitationId)) return false;
    this.told.add(elicitationId);
    await this.client.notify("elicitation/complete", { elicitationId });
    return true;
  }

  private onIncoming(message: Message): void {
    const params = record(message.params);
    const sessionId = params?.sessionId;
    if (message.method === "initialize" && this.initializeParams === undefined && params !== undefined) {
      this.initializeParams = params;
    } else if (message.method === "session/prompt" && typeof sessionId === "string" && message.id !== undefined) {
      this.turns.get(sessionId)?.controller.abort("session_cancel"); // a new turn replaces one still running
      this.turns.set(sessionId, { requestId: message.id, controller: new AbortController() });
    } else if (message.method === "session/cancel" && typeof sessionId === "string") {
      this.stop(this.turns.get(sessionId), "session_cancel");
    } else if (message.method === "$/cancel_request" && params !== undefined) {
      for (const turn of this.turns.values()) {
        if (turn.requestId === params.requestId) this.stop(turn, "client_cancel_request");
      }
    }
  }

  private onOutgoing(message: Message): void {
    if (message.method !== undefined || message.id === undefined) return;
    for (const [sessionId, turn] of this.turns) {
      if (turn.requestId === message.id) this.turns.delete(sessionId); // the prompt was answered: the turn ended
    }
  }

  private stop(turn: Turn | undefined, cause: StopCause): void {
    if (turn !== undefined && !turn.controller.signal.aborted) turn.controller.abort(cause);
  }

  private onClosed(): void {
    if (this.closed) return;
    this.ended.abort("client_disconnected");
    for (const turn of this.turns.values()) this.stop(turn, "client_disconnected");
  }
}
