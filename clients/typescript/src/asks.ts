// What the ACP and MCP sides share: the body of `POST /v1/elicitations` from what the agent or server asked, the
// outcome a stored grant settles, and the client's answer to `elicitation/create` as the sidecar takes it (ACP's and
// MCP's results have the same shape: `action`, and for a refusal `_meta.message`).
import { AuthorizationOutcome } from "./outcomes.js";
import type { Answer, CreateElicitation, Grant, Scope, User } from "./types.js";

/** What both sides ask the sidecar for. */
export type Ask = {
  user: User;
  provider: string;
  scopes?: string[];
  scope: Scope;
  message?: string;
  askAgain?: boolean;
  connection?: Record<string, string>;
};

export function createBody(request: Ask): CreateElicitation {
  const body: CreateElicitation = { user: request.user, provider: request.provider, scope: request.scope };
  if (request.scopes !== undefined) body.scopes = request.scopes;
  if (request.message !== undefined) body.message = request.message;
  if (request.askAgain) body.askAgain = true;
  if (request.connection !== undefined && Object.keys(request.connection).length > 0) {
    body.connection = request.connection;
  }
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
