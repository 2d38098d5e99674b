// What `requestAuthorization` answers: a status, the grant when there is one, and a sentence safe to show the user
// or the model (as the Python connector's `AuthorizationOutcome`).
import type { AuthorizationStatus, ElicitationState, Grant } from "./types.js";

const SENTENCES: Record<AuthorizationStatus, string> = {
  authorized: "Access to {provider} was granted.",
  already_authorized: "Access to {provider} was already granted.",
  narrowed: "Access to {provider} was granted without {refused}.",
  unsupported:
    "This client cannot open authorization links (it does not support URL-mode elicitation), so access to " +
    "{provider} cannot be requested here.",
  declined: "The user declined access to {provider}.",
  cancelled: "The request for access to {provider} was dismissed.",
  refused: "The client refused to show the request for access to {provider}.",
  client_error: "The client refused the request for access to {provider}.",
  disconnected: "The client disconnected before access to {provider} was granted.",
  expired: "The request for access to {provider} expired before it was completed.",
  failed: "Authorization with {provider} failed.",
};

const CLIENT_REFUSED = "client_refused: ";

export class AuthorizationOutcome {
  constructor(
    readonly status: AuthorizationStatus,
    readonly provider: string,
    readonly providerDisplayName: string,
    readonly details: {
      elicitationId?: string;
      grant?: Grant | null;
      reason?: string | null;
      refusedScopes?: string[];
    } = {},
  ) {}

  static of(state: ElicitationState): AuthorizationOutcome {
    return new AuthorizationOutcome(state.outcome ?? "failed", state.provider, state.providerDisplayName, {
      elicitationId: state.elicitationId,
      grant: state.grant,
      reason: state.reason,
      refusedScopes: state.refusedScopes ?? [],
    });
  }

  /** A grant covering every scope asked for exists (`narrowed` is not ok: look at `grantedScopes`). */
  get ok(): boolean {
    return this.status === "authorized" || this.status === "already_authorized";
  }

  /** Whether the elicitation completed (authorized or narrowed): the client was told with `elicitation/complete`. */
  get completed(): boolean {
    return this.details.elicitationId !== undefined && (this.status === "authorized" || this.status === "narrowed");
  }

  get elicitationId(): string | undefined {
    return this.details.elicitationId;
  }

  get grant(): Grant | undefined {
    return this.details.grant ?? undefined;
  }

  get grantedScopes(): string[] {
    return this.grant?.scopes ?? [];
  }

  get refusedScopes(): string[] {
    return this.details.refusedScopes ?? [];
  }

  get reason(): string | undefined {
    return this.details.reason ?? undefined;
  }

  /** The client's own reason when it refused (`refused`: it answered cancel with `_meta.message`). */
  get clientMessage(): string | undefined {
    const reason = this.reason;
    return this.status === "refused" && reason?.startsWith(CLIENT_REFUSED)
      ? reason.slice(CLIENT_REFUSED.length)
      : undefined;
  }

  /** A sentence safe to show the user or the model. */
  describe(): string {
    const text = SENTENCES[this.status]
      .replace("{provider}", this.providerDisplayName)
      .replace("{refused}", this.refusedScopes.join(", "));
    const detail = this.clientMessage !== undefined ? `the client said: ${this.clientMessage}` : this.reason;
    return detail && !this.ok ? `${text} (${detail})` : text;
  }
}
