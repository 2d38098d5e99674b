// The connector's /v1 API over fetch, typed by its OpenAPI document. The agent keeps its ACP connection; the
// sidecar keeps every secret (tokens never come back here).
import { SidecarError } from "./errors.js";
import type {
  Answer,
  Cancel,
  CreateElicitation,
  Created,
  ElicitationState,
  ErrorBody,
  Grant,
  GrantList,
  StopCause,
  User,
} from "./types.js";

export type SidecarOptions = {
  /** The sidecar's base URL, e.g. http://127.0.0.1:8700. */
  baseUrl: string;
  /** An API key from `acp-connector api-keys create`. */
  apiKey: string;
  /** The fetch to use (default: the global one). */
  fetch?: typeof fetch;
};

/** Seconds one long-poll asks the sidecar to hold (a wait is repeated until the elicitation has ended). */
export const WAIT_SECONDS = 20;

export class SidecarApi {
  readonly baseUrl: string;
  private readonly apiKey: string;
  private readonly fetcher: typeof fetch;

  constructor(options: SidecarOptions) {
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.apiKey = options.apiKey;
    this.fetcher = options.fetch ?? fetch;
  }

  /** `POST /v1/elicitations`: create (or, with `grantsOnly` / `urlMode: false`, only look at stored grants). */
  createElicitation(body: CreateElicitation, idempotencyKey?: string): Promise<Created> {
    const headers: Record<string, string> = idempotencyKey === undefined ? {} : { "Idempotency-Key": idempotencyKey };
    return this.call("POST", "/v1/elicitations", body, headers);
  }

  /** `GET /v1/elicitations/{id}`, with `wait`: once it has an outcome or when the seconds are up. */
  elicitation(elicitationId: string, options: { wait?: number; signal?: AbortSignal } = {}): Promise<ElicitationState> {
    const query = options.wait === undefined ? "" : `?wait=${options.wait}`;
    return this.call(
      "GET",
      `/v1/elicitations/${encodeURIComponent(elicitationId)}${query}`,
      undefined,
      {},
      options.signal,
    );
  }

  /** `POST /v1/elicitations/{id}/answer`: how the client answered `elicitation/create` (once). */
  answer(elicitationId: string, answer: Answer): Promise<ElicitationState> {
    return this.call("POST", `/v1/elicitations/${encodeURIComponent(elicitationId)}/answer`, answer);
  }

  /** `POST /v1/elicitations/{id}/cancel`: end an open elicitation for `cause`. */
  cancel(elicitationId: string, cause: StopCause, requestCancelled?: boolean): Promise<ElicitationState> {
    const body: Cancel = requestCancelled === undefined ? { cause } : { cause, requestCancelled };
    return this.call("POST", `/v1/elicitations/${encodeURIComponent(elicitationId)}/cancel`, body);
  }

  /** `GET /v1/grants`: the user's grants (never a token), at `provider` when given. */
  async grants(user: User, provider?: string): Promise<Grant[]> {
    const query = new URLSearchParams({ issuer: user.issuer, subject: user.subject });
    if (provider !== undefined) query.set("provider", provider);
    const list: GrantList = await this.call("GET", `/v1/grants?${query.toString()}`);
    return list.grants;
  }

  /** `DELETE /v1/grants/{id}`: revoke at the provider where it allows, and delete. */
  async deleteGrant(grantId: string): Promise<void> {
    await this.call("DELETE", `/v1/grants/${encodeURIComponent(grantId)}`);
  }

  /** A provider API call through the token proxy: the sidecar adds the user's token; it never comes here. */
  proxy(user: User, provider: string, path: string, init: RequestInit = {}, account?: string): Promise<Response> {
    const headers = new Headers(init.headers);
    headers.set("Authorization", `Bearer ${this.apiKey}`);
    headers.set("Connector-User-Issuer", user.issuer);
    headers.set("Connector-User-Subject", user.subject);
    if (account !== undefined) headers.set("Connector-Account", account);
    const relative = path.replace(/^\/+/, "");
    return this.fetcher(`${this.baseUrl}/v1/proxy/${encodeURIComponent(provider)}/${relative}`, { ...init, headers });
  }

  /** An authenticated request to the API, answered as it comes (for streams: `GET /v1/events`). */
  raw(path: string, init: RequestInit = {}): Promise<Response> {
    const headers = new Headers(init.headers);
    headers.set("Authorization", `Bearer ${this.apiKey}`);
    return this.fetcher(`${this.baseUrl}${path}`, { ...init, headers });
  }

  private async call<T>(
    method: string,
    path: string,
    body?: unknown,
    headers: Record<string, string> = {},
    signal?: AbortSignal,
  ): Promise<T> {
    const init: RequestInit = { method, headers: { "Content-Type": "application/json", ...headers } };
    if (body !== undefined) init.body = JSON.stringify(body);
    if (signal !== undefined) init.signal = signal;
    const response = await this.raw(path, init);
    if (response.status === 204) return undefined as T;
    const text = await response.text();
    let payload: unknown;
    try {
      payload = JSON.parse(text);
    } catch {
      payload = undefined;
    }
    if (!response.ok || typeof payload !== "object" || payload === null) {
      const error = (payload as Partial<ErrorBody> | undefined)?.error;
      throw new SidecarError(
        response.status,
        error?.code ?? `http_${response.status}`,
        error?.message ?? `The sidecar answered HTTP ${response.status}.`,
        error?.labels ?? undefined,
      );
    }
    return payload as T;
  }
}
