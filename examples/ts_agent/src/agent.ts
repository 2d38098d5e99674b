// An ACP agent over stdio whose one tool lists the user's GitHub repositories. It asks for the user's
// authorization with a URL-mode elicitation that a sidecar connector created, and calls GitHub through the
// sidecar's token proxy. Environment: SIDECAR_URL, SIDECAR_API_KEY, AGENT_USER_ISSUER, AGENT_USER_SUBJECT
// (the user this agent acts for, as its own sign-in verified them).
import { Readable, Writable } from "node:stream";

import { agent, methods, ndJsonStream, RequestError, PROTOCOL_VERSION } from "@agentclientprotocol/sdk";
import type { AgentContext, ClientCapabilities, SessionUpdate } from "@agentclientprotocol/sdk";

import { Sidecar, SidecarError, type Answer, type State, type StopCause, type User } from "./sidecar.js";

const sidecar = new Sidecar(required("SIDECAR_URL"), required("SIDECAR_API_KEY"));
const user: User = { issuer: required("AGENT_USER_ISSUER"), subject: required("AGENT_USER_SUBJECT") };
const connectionId = crypto.randomUUID(); // events and states name this connection
const SCOPES = ["repo"];
const REQUEST_CANCELLED = -32800; // JSON-RPC: the request was cancelled

let capabilities: ClientCapabilities | undefined;
let toolCalls = 0;
const turns = new Map<string, AbortController>();

function required(name: string): string {
  const value = process.env[name];
  if (!value) {
    console.error(`ts-agent: set ${name}`);
    process.exit(2);
  }
  return value;
}

function urlModeAdvertised(): boolean {
  // Only an explicit, non-null `url` object counts ({} or {"url": null} advertise nothing).
  const url = (capabilities?.elicitation as { url?: unknown } | null | undefined)?.url;
  return typeof url === "object" && url !== null;
}

async function say(client: AgentContext, sessionId: string, text: string): Promise<void> {
  await update(client, sessionId, { sessionUpdate: "agent_message_chunk", content: { type: "text", text } });
}

/** What the user let the agent do: the scopes asked for that the provider refused, or why nothing was granted. */
type Access = { refusedScopes: string[] } | { notGranted: string };

// A short sentence per outcome without a grant (as `AuthorizationOutcome.describe()`): never a reason the client or
// the provider wrote, never a secret.
const NOT_GRANTED: Record<string, string> = {
  declined: "The user declined access to GitHub.",
  cancelled: "The request for access to GitHub was dismissed.",
  refused: "The client refused to show the request for access to GitHub.",
  client_error: "The client refused the request for access to GitHub.",
  disconnected: "The client disconnected before access to GitHub was granted.",
  expired: "The request for access to GitHub expired before it was completed.",
  failed: "Authorization with GitHub failed.",
};
const UNSUPPORTED = "This client cannot open authorization links (no URL-mode elicitation), so GitHub access cannot be requested here.";

function notGranted(outcome: string | null): Access {
  return { notGranted: NOT_GRANTED[outcome ?? "failed"] ?? NOT_GRANTED.failed };
}

/** Get the user's GitHub authorization, as the connector's Python client does (`AcpAuthorizer`). */
async function authorize(client: AgentContext, sessionId: string, toolCallId: string, signal: AbortSignal): Promise<Access> {
  const ask = { user, provider: "github", scopes: SCOPES, scope: { sessionId, toolCallId } };
  // Stored grants first, whatever the client can do: a narrowed grant answers at once (no prompt loop).
  const settled = await sidecar.settled(ask);
  if (settled.status !== "needs_user") return { refusedScopes: settled.refusedScopes };
  if (!urlModeAdvertised()) {
    await sidecar.unsupported(ask); // recorded at the sidecar as the embedded connector records it
    return { notGranted: UNSUPPORTED }; // nothing is sent to such a client (never a form)
  }
  const created = await sidecar.createElicitation(ask, connectionId);
  if (created.status !== "created") return { refusedScopes: created.refusedScopes }; // a grant settled it meanwhile
  // Watched before elicitation/create goes out: nothing can end the elicitation unseen. A cancelled turn stops it.
  const watching = new AbortController();
  const ended = sidecar.ended(created.elicitationId, AbortSignal.any([signal, watching.signal]));
  ended.catch(() => undefined); // read below, or abandoned when the client answered otherwise
  let state: State | null;
  try {
    state = await elicit(client, sessionId, toolCallId, created, ended, signal);
  } finally {
    watching.abort();
  }
  if (state === null || (state.outcome !== "authorized" && state.outcome !== "narrowed")) {
    return notGranted(state === null ? "disconnected" : state.outcome);
  }
  // Exactly once, on this connection, with the original id: a narrowed grant completed the elicitation too.
  if (!connection.signal.aborted) {
    await client.notify(methods.client.elicitation.complete, { elicitationId: created.elicitationId });
  }
  return { refusedScopes: state.refusedScopes };
}

/**
 * Ask the client and follow the elicitation to its end: the ended state, or null when the connection closed while
 * the browser flow was still open (the elicitation is then cancelled as a disconnect: nobody is left to tell).
 */
async function elicit(
  client: AgentContext,
  sessionId: string,
  toolCallId: string,
  created: { elicitationId: string; url: string; message: string },
  ended: Promise<State>,
  signal: AbortSignal,
): Promise<State | null> {
  const withdraw = new AbortController(); // aborting it sends $/cancel_request for our elicitation/create
  let answer: Answer | undefined;
  const asked = askClient(client, sessionId, toolCallId, created, AbortSignal.any([signal, withdraw.signal])).then(
    (answered) => (answer = answered),
  );
  asked.catch(() => undefined); // read below when the turn was cancelled
  try {
    const end = await Promise.race([asked.then(() => null), ended]);
    if (answer === undefined && end !== null) {
      // It ended before the client answered (it expired or was cancelled, or the browser was faster): the question
      // is no longer relevant to the client. The end's outcome is the outcome.
      return end;
    }
  } catch (error) {
    if (signal.aborted) {
      // The SDK stopped waiting for the create at once: it was withdrawn when it failed as cancelled.
      const withdrawn = await asked.then(
        () => false,
        (failure: unknown) => failure instanceof RequestError && failure.code === REQUEST_CANCELLED,
      );
      await stopped(created.elicitationId, signal, withdrawn);
    }
    throw error;
  } finally {
    withdraw.abort(); // sends $/cancel_request only while the create is unanswered (the SDK forgets it once answered)
  }
  const answered = answer as Answer; // the race ended with the client's answer
  let end: State | null;
  try {
    const state = await sidecar.answer(created.elicitationId, answered);
    if (answered.action !== "accept") return state; // the outcome of the answer (or of an end that came first)
    // Accepted. Now the browser: wait for the end, or for the connection to end.
    end = await Promise.race([ended, connection.closed.then(() => null)]);
  } catch (error) {
    if (signal.aborted) await stopped(created.elicitationId, signal, false);
    throw error;
  }
  if (end !== null) return end;
  try {
    // Nobody is left to tell. A flow the user already took to GitHub still stores its grant.
    await sidecar.cancel(created.elicitationId, "client_disconnected");
    return null;
  } catch (error) {
    if (error instanceof SidecarError && error.code === "already_ended") return sidecar.state(created.elicitationId);
    throw error;
  }
}

/** The turn was cancelled: end the elicitation, saying why. Nothing resumes it; no elicitation/complete follows. */
async function stopped(elicitationId: string, signal: AbortSignal, withdrawn: boolean): Promise<void> {
  const cause: StopCause = connection.signal.aborted ? "client_disconnected" : (signal.reason as StopCause);
  await sidecar.cancel(elicitationId, cause, withdrawn).catch(() => undefined);
}

/** Send `elicitation/create` with what the sidecar created; the client's answer, as the sidecar records it. */
async function askClient(
  client: AgentContext,
  sessionId: string,
  toolCallId: string,
  created: { elicitationId: string; url: string; message: string },
  cancel: AbortSignal,
): Promise<Answer> {
  try {
    const response = await client.request(
      methods.client.elicitation.create,
      { sessionId, toolCallId, mode: "url", elicitationId: created.elicitationId, url: created.url, message: created.message },
      // Aborting `cancel` sends $/cancel_request for this request and stops waiting for its answer.
      { cancellationSignal: cancel, stopWaitingOnCancel: true },
    );
    return { action: response.action as "accept" | "decline" | "cancel" };
  } catch (error) {
    if (connection.signal.aborted) return { action: "disconnected" }; // no answer came: the connection closed
    if (cancel.aborted) throw error;
    return { action: "client_error", code: error instanceof RequestError ? error.code : -32603 };
  }
}

/** A session update, unless the connection has closed (nobody is left to tell). */
async function update(client: AgentContext, sessionId: string, change: SessionUpdate): Promise<void> {
  if (connection.signal.aborted) return;
  await client.notify(methods.client.session.update, { sessionId, update: change });
}

/** End the tool call (`completed` or `failed`) with a sentence for the user, and say it. */
async function finish(client: AgentContext, sessionId: string, toolCallId: string, text: string, ok: boolean): Promise<void> {
  const content = [{ type: "content" as const, content: { type: "text" as const, text } }];
  await update(client, sessionId, { sessionUpdate: "tool_call_update", toolCallId, status: ok ? "completed" : "failed", content });
  await say(client, sessionId, text);
}

async function listRepositories(client: AgentContext, sessionId: string, signal: AbortSignal): Promise<void> {
  const toolCallId = `call_${++toolCalls}`;
  await update(client, sessionId, { sessionUpdate: "tool_call", toolCallId, title: "List GitHub repositories", kind: "fetch", status: "pending" });
  try {
    const access = await authorize(client, sessionId, toolCallId, signal);
    if ("notGranted" in access) {
      await finish(client, sessionId, toolCallId, access.notGranted, false);
      return;
    }
    if (access.refusedScopes.length > 0) {
      // Narrowed: decide whether what was granted is enough. Without `repo`, GitHub lists public repositories only.
      await say(client, sessionId, `GitHub did not grant ${access.refusedScopes.join(", ")}: only public repositories are listed.`);
    }
    const response = await sidecar.proxy("github", "user/repos", user);
    if (!response.ok) {
      await finish(client, sessionId, toolCallId, `GitHub could not be reached (HTTP ${response.status}).`, false);
      return;
    }
    const repos = (await response.json()) as Array<{ full_name: string }>;
    await finish(client, sessionId, toolCallId, `Your repositories: ${repos.map((repo) => repo.full_name).join(", ")}`, true);
  } catch (error) {
    await update(client, sessionId, { sessionUpdate: "tool_call_update", toolCallId, status: "failed" }).catch(() => undefined);
    throw error;
  }
}

const app = agent({ name: "acp-connector-ts-example" })
  .onRequest(methods.agent.initialize, ({ params }) => {
    capabilities = params.clientCapabilities;
    return { protocolVersion: PROTOCOL_VERSION, agentCapabilities: {} };
  })
  .onRequest(methods.agent.session.new, () => ({ sessionId: `sess_${crypto.randomUUID()}` }))
  .onRequest(methods.agent.session.prompt, async ({ params, client, signal }) => {
    const turn = new AbortController(); // aborted with the StopCause: session/cancel, or $/cancel_request for the prompt
    turns.set(params.sessionId, turn);
    // The prompt's signal also aborts when the connection closes: that is told apart (as a disconnect) where it matters.
    signal.addEventListener("abort", () => connection.signal.aborted || turn.abort("client_cancel_request"), { once: true });
    try {
      await listRepositories(client, params.sessionId, turn.signal);
      return { stopReason: "end_turn" };
    } catch (error) {
      if (turn.signal.aborted) return { stopReason: "cancelled" };
      throw error;
    } finally {
      turns.delete(params.sessionId);
    }
  })
  .onNotification(methods.agent.session.cancel, ({ params }) => {
    turns.get(params.sessionId)?.abort("session_cancel");
  });

const connection = app.connect(
  ndJsonStream(Writable.toWeb(process.stdout) as WritableStream<Uint8Array>, Readable.toWeb(process.stdin) as ReadableStream<Uint8Array>),
);
await connection.closed;
