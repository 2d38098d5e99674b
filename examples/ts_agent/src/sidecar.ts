// The connector's /v1 API, with fetch: the agent keeps its ACP connection, the sidecar keeps every secret.

export type User = { issuer: string; subject: string };
export type Scope = { sessionId: string; toolCallId?: string } | { requestId: string | number };
export type Grant = { grantId: string; provider: string; accountId: string; scopes: string[] };
export type Ask = { user: User; provider: string; scopes?: string[]; scope: Scope };
// `narrowed`: a grant lacks only scopes the provider refused when it was made (asking again would ask the same).
export type Settled = { status: "already_authorized" | "narrowed"; grant: Grant; refusedScopes: string[] };
export type Created =
  | { status: "created"; elicitationId: string; url: string; message: string; expiresAt: string }
  | Settled;
export type State = {
  elicitationId: string;
  status: string;
  outcome: string | null;
  reason: string | null;
  grant: Grant | null;
  refusedScopes: string[];
};
/** Why the work waiting on an elicitation stopped (`client_disconnected`: the outcome then reads `disconnected`). */
export type StopCause = "agent" | "session_cancel" | "client_cancel_request" | "client_disconnected";
export type Answer =
  | { action: "accept" | "decline" | "cancel" | "disconnected" }
  | { action: "client_error"; code: number; message?: string };

export class SidecarError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(`${code}: ${message}`);
  }
}

export class Sidecar {
  constructor(
    private readonly baseUrl: string,
    private readonly apiKey: string,
  ) {}

  /** What stored grants alone answer (`needs_user`: none settles it); nothing is created or written. */
  settled(ask: Ask): Promise<Settled | { status: "needs_user" }> {
    return this.call("POST", "/v1/elicitations", { ...ask, grantsOnly: true });
  }

  /** A new elicitation for the agent's connection, or what a grant answers when one settled it meanwhile. */
  createElicitation(ask: Ask, connectionId: string): Promise<Created> {
    // The idempotency key makes a retried POST (after a timeout) answer with the same elicitation.
    return this.call("POST", "/v1/elicitations", { ...ask, connectionId }, { "Idempotency-Key": crypto.randomUUID() });
  }

  answer(elicitationId: string, answer: Answer): Promise<State> {
    return this.call("POST", `/v1/elicitations/${elicitationId}/answer`, answer);
  }

  /** The elicitation once it has ended: long-polls the sidecar, a bounded wait at a time. */
  async ended(elicitationId: string, signal?: AbortSignal): Promise<State> {
    for (;;) {
      signal?.throwIfAborted();
      const state: State = await this.call("GET", `/v1/elicitations/${elicitationId}?wait=20`, undefined, {}, signal);
      if (state.outcome !== null) return state;
    }
  }

  /** The elicitation's state now. */
  state(elicitationId: string): Promise<State> {
    return this.call("GET", `/v1/elicitations/${elicitationId}`);
  }

  /** Have the sidecar record that the client cannot be asked (nothing is created; a stored grant still answers). */
  unsupported(ask: Ask): Promise<Settled | { status: "unsupported" }> {
    return this.call("POST", "/v1/elicitations", { ...ask, urlMode: false });
  }

  /** End an open elicitation for `cause`; `requestCancelled`: whether our `elicitation/create` was withdrawn. */
  cancel(elicitationId: string, cause: StopCause, requestCancelled?: boolean): Promise<State> {
    return this.call("POST", `/v1/elicitations/${elicitationId}/cancel`, { cause, requestCancelled });
  }

  /** A provider API call through the token proxy: the token is added by the sidecar, never seen here. */
  proxy(provider: string, path: string, user: User): Promise<Response> {
    return fetch(`${this.baseUrl}/v1/proxy/${provider}/${path}`, {
      headers: {
        Authorization: `Bearer ${this.apiKey}`,
        "Connector-User-Issuer": user.issuer,
        "Connector-User-Subject": user.subject,
      },
    });
  }

  private async call<T>(
    method: string,
    path: string,
    body?: unknown,
    headers: Record<string, string> = {},
    signal?: AbortSignal,
  ): Promise<T> {
    const response = await fetch(`${this.baseUrl}${path}`, {
      method,
      headers: { Authorization: `Bearer ${this.apiKey}`, "Content-Type": "application/json", ...headers },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
    });
    const payload = (await response.json()) as { error?: { code: string; message: string } };
    if (!response.ok) {
      throw new SidecarError(response.status, payload.error?.code ?? "unknown", payload.error?.message ?? "");
    }
    return payload as T;
  }
}
