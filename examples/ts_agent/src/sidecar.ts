// The connector's /v1 API, with fetch: the agent keeps its ACP connection, the sidecar keeps every secret.

export type User = { issuer: string; subject: string };
export type Scope = { sessionId: string; toolCallId?: string } | { requestId: string | number };
export type Grant = { grantId: string; provider: string; accountId: string; scopes: string[] };
export type Created =
  | { status: "created"; elicitationId: string; url: string; message: string; expiresAt: string }
  | { status: "already_authorized"; grant: Grant };
export type State = {
  elicitationId: string;
  status: string;
  outcome: string | null;
  reason: string | null;
  grant: Grant | null;
};
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

  createElicitation(body: {
    user: User;
    provider: string;
    scopes?: string[];
    scope: Scope;
    connectionId?: string;
  }): Promise<Created> {
    // The idempotency key makes a retried POST (after a timeout) answer with the same elicitation.
    return this.call("POST", "/v1/elicitations", body, { "Idempotency-Key": crypto.randomUUID() });
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

  async grants(user: User, provider: string): Promise<Grant[]> {
    const query = new URLSearchParams({ issuer: user.issuer, subject: user.subject, provider });
    const body: { grants: Grant[] } = await this.call("GET", `/v1/grants?${query}`);
    return body.grants;
  }

  cancel(elicitationId: string): Promise<State> {
    return this.call("POST", `/v1/elicitations/${elicitationId}/cancel`);
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
