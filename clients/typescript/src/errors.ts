// The errors the package throws: each has a stable `code` and a message a person can read.
import type { StopCause } from "./types.js";

/** The sidecar refused a call (`status`: its HTTP status, `code`: its stable error code; `labels`, for
 * `account_choice_needed`: the user's accounts at the provider, by label). */
export class SidecarError extends Error {
  override readonly name: string = "SidecarError";
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly labels?: readonly string[],
  ) {
    super(message);
  }
}

/**
 * The sidecar could not be reached until the elicitation expired, so the authorization did not complete. The
 * message is a sentence for the user: what happened, since when, and that the request expired.
 */
export class SidecarUnavailableError extends SidecarError {
  override readonly name = "SidecarUnavailableError";
  constructor(
    message: string,
    readonly downSince: Date,
    readonly expiresAt: Date,
    options?: { cause?: unknown },
  ) {
    super(0, "sidecar_unavailable", message);
    if (options?.cause !== undefined) (this as { cause?: unknown }).cause = options.cause;
  }
}

/**
 * The work waiting on the authorization was cancelled (`stopCause`): the client's `session/cancel` or
 * `$/cancel_request`, the agent's own signal, or the connection closing. The elicitation was ended at the sidecar
 * with that cause; nothing resumes, and no `elicitation/complete` follows.
 */
export class AuthorizationCancelled extends Error {
  override readonly name = "AuthorizationCancelled";
  constructor(readonly stopCause: StopCause) {
    super(CANCELLED[stopCause]);
  }
}

const CANCELLED: Record<StopCause, string> = {
  agent: "The agent stopped waiting for the authorization.",
  session_cancel: "The client cancelled the session's work.",
  client_cancel_request: "The client cancelled the request being served.",
  client_disconnected: "The client disconnected.",
};

/** The client has not sent `initialize` on this connection, so its capabilities are unknown. */
export class ClientNotInitialized extends Error {
  override readonly name = "ClientNotInitialized";
  constructor() {
    super("The client has not initialized this connection: its capabilities are not known yet.");
  }
}
