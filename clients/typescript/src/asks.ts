// What the ACP and MCP sides share: the body of `POST /v1/elicitations` from what the agent or server asked, the
// outcome a stored grant settles, and the client's answer to `elicitation/create` as the sidecar takes it (ACP's and
// MCP's results have the same shape: `action`, and for a refusal `_meta.message`).
import { WAIT_SECONDS, type SidecarApi } from "./api.js";
import { AuthorizationCancelled, SidecarError } from "./errors.js";
import { AuthorizationOutcome } from "./outcomes.js";
import { untilExpiry, type Backoff } from "./retry.js";
import type { Answer, CreateElicitation, ElicitationState, Grant, Scope, StopCause, User } from "./types.js";

/** An elicitation the sidecar created, as both sides send it to their client. */
export type Created = { elicitationId: string; url: string; message: string; expiresAt: Date };

/** What both sides ask the sidecar for. */
export type Ask = {
  user: User;
  provider: string;
  scopes?: string[];
  scope: Scope;
  message?: string;
  askAgain?: boolean;
  connection?: Record<string, string>;
  account?: string;
};

export function createBody(request: Ask): CreateElicitation {
  const body: CreateElicitation = { user: request.user, provider: request.provider, scope: request.scope };
  if (request.scopes !== undefined) body.scopes = request.scopes;
  if (request.message !== undefined) body.message = request.message;
  if (request.askAgain) body.askAgain = true;
  if (request.connection !== undefined && Object.keys(request.connection).length > 0) {
    body.connection = request.connection;
  }
  if (request.account !== undefined) body.account = request.account;
  return body;
}

export function settledOutcome(
  provider: string,
  status: "already_authorized" | "narrowed" | "needs_user" | "unsupported",
  answer: { providerDisplayName: string; grant?: Grant | null; refusedScopes?: string[] },
): AuthorizationOutcome {
  const refusedScopes = answer.refusedScopes ?? [];
  const reason = status === "narrowed" ? "refused at the provider when the grant was made; not asked again" : null;
  return new AuthorizationOutcome(status === "needs_user" ? "failed" : status, provider, answer.providerDisplayName, {
    grant: answer.grant ?? null,
    reason,
    refusedScopes,
  });
}

/** What the client's result for `elicitation/create` says, as the sidecar takes it. */
export function readAnswer(result: Record<string, unknown>): Answer {
  const action = result.action;
  if (action === "accept" || action === "decline") return { action };
  if (action === "cancel") {
    // A cancel with the client's own reason is the client refusing by its policy (recorded `refused`).
    const message = (result._meta as { message?: unknown } | undefined)?.message;
    return typeof message === "string" && message.trim() !== ""
      ? { action, message: message.slice(0, 500) }
      : { action };
  }
  const named = typeof action === "string" ? action.slice(0, 64) : "(none)";
  return { action: "client_error", code: -32602, message: `unknown_action: ${named}` };
}

/** The calls both sides make on a created elicitation, each tried again while the sidecar cannot be reached, until
 * the elicitation's expiry. */
export class ElicitationCalls {
  constructor(
    private readonly api: SidecarApi,
    private readonly backoff: Backoff | undefined,
  ) {}

  /** Report the client's answer. */
  async report(created: Created, answer: Answer): Promise<ElicitationState> {
    let tried = false;
    return untilExpiry(
      async () => {
        try {
          return await this.api.answer(created.elicitationId, answer);
        } catch (error) {
          // An earlier attempt whose answer was lost got through.
          if (tried && error instanceof SidecarError && error.code === "already_answered") {
            return await this.api.elicitation(created.elicitationId);
          }
          throw error;
        } finally {
          tried = true;
        }
      },
      { expiresAt: created.expiresAt, baseUrl: this.api.baseUrl, ...(this.backoff ? { backoff: this.backoff } : {}) },
    );
  }

  /** The elicitation once it has ended: long-polls, and survives a sidecar restart until the expiry. */
  async ended(created: Created, signal: AbortSignal): Promise<ElicitationState> {
    for (;;) {
      const state = await untilExpiry(
        () => this.api.elicitation(created.elicitationId, { wait: WAIT_SECONDS, signal }),
        {
          expiresAt: created.expiresAt,
          baseUrl: this.api.baseUrl,
          signal,
          ...(this.backoff ? { backoff: this.backoff } : {}),
        },
      );
      if (state.outcome !== null) return state;
    }
  }

  /** End the elicitation for `cause` (nothing resumes it, no completion follows); the error to throw. */
  async stopped(elicitationId: string, cause: StopCause, withdrawn: boolean | undefined): Promise<Error> {
    try {
      await this.api.cancel(elicitationId, cause, withdrawn);
    } catch (error) {
      if (!(error instanceof SidecarError && error.code === "already_ended")) return error as Error;
    }
    return new AuthorizationCancelled(cause);
  }
}
