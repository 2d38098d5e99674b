// A small typed helper for the connector's /v1 API (fetch only): the MCP server keeps its MCP connection, the sidecar
// keeps every secret. The calls an MCP server needs, as the Python face (`service/mcp/`) makes them.

export type User = { issuer: string; subject: string };
export type Ask = { user: User; provider: string; scopes?: string[]; scope: { requestId: string | number } };
export type Grant = { grantId: string; provider: string; accountId: string; scopes: string[] };
export type Settled = { status: "already_authorized" | "narrowed"; grant: Grant; refusedScopes: string[] };
export type Created = { status: "created"; elicitationId: string; url: string; message: string } | Settled;
export type State = { elicitationId: string; status: string; outcome: string | null; reason: string | null };
export type Answer = { action: "accept" | "decline" | "cancel" | "disconnected" };

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

  /** Record that the client cannot be asked (no URL mode): nothing is created; a stored grant still answers. */
  unsupported(ask: Ask): Promise<Settled | { status: "unsupported" }> {
    return this.call("POST", "/v1/elicitations", { ...ask, urlMode: false });
  }

  /** A new elicitation bound to the MCP connection `connectionId` (or what a grant answers meanwhile). */
  create(ask: Ask, connectionId: string): Promise<Created> {
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

  cancel(elicitationId: string, cause: "agent" | "client_disconnected"): Promise<State> {
    return this.call("POST", `/v1/elicitations/${elicitationId}/cancel`, { cause });
  }

  /** A provider API call through the sidecar's token proxy: the token is injected there, never seen here. */
  proxy(user: User, provider: string, path: string): Promise<Response> {
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
    const json = (await response.json()) as { error?: { code: string; message: string } } & T;
    if (!response.ok) {
      throw new SidecarError(response.status, json.error?.code ?? "unknown", json.error?.message ?? response.statusText);
    }
    return json;
  }
}
