// An ACP agent over stdio whose one tool lists the user's GitHub repositories. It asks for the user's
// authorization with a URL-mode elicitation that a sidecar connector created, and calls GitHub through the
// sidecar's token proxy. Environment: SIDECAR_URL, SIDECAR_API_KEY, AGENT_USER_ISSUER, AGENT_USER_SUBJECT
// (the user this agent acts for, as its own sign-in verified them).
import { Readable, Writable } from "node:stream";

import { agent, methods, ndJsonStream, RequestError, PROTOCOL_VERSION } from "@agentclientprotocol/sdk";
import type { AgentContext, ClientCapabilities } from "@agentclientprotocol/sdk";

import { Sidecar, type Answer, type State, type User } from "./sidecar.js";

const sidecar = new Sidecar(required("SIDECAR_URL"), required("SIDECAR_API_KEY"));
const user: User = { issuer: required("AGENT_USER_ISSUER"), subject: required("AGENT_USER_SUBJECT") };
const connectionId = crypto.randomUUID(); // events and states name this connection
const SCOPES = ["repo"];

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
  await client.notify(methods.client.session.update, {
    sessionId,
    update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text } },
  });
}

/** What the user let the agent do: the scopes asked for that the provider refused, or why nothing was granted. */
type Access = { refusedScopes: string[] } | { notGranted: string };

/** Get the user's GitHub authorization, as the connector's Python client does (`AcpAuthorizer`). */
async function authorize(client: AgentContext, sessionId: string, toolCallId: string, signal: AbortSignal): Promise<Access> {
  const ask = { user, provider: "github", scopes: SCOPES, scope: { sessionId, toolCallId } };
  // Stored grants first, whatever the client can do: a narrowed grant answers at once (no prompt loop).
  const settled = await sidecar.settled(ask);
  if (settled.status !== "needs_user") return { refusedScopes: settled.refusedScopes };
  if (!urlModeAdvertised()) {
    // Nothing is sent to such a client (never a form instead).
    return { notGranted: "This client cannot open authorization links (no URL-mode elicitation), so GitHub access cannot be requested here." };
  }
  const created = await sidecar.createElicitation(ask, connectionId);
  if (created.status !== "created") return { refusedScopes: created.refusedScopes }; // a grant settled it meanwhile
  let state: State;
  try {
    const answer = await askClient(client, sessionId, toolCallId, created, signal);
    state = await sidecar.answer(created.elicitationId, answer);
    if (answer.action === "accept") state = await sidecar.ended(created.elicitationId, signal);
  } catch (error) {
    // A cancelled turn ends the elicitation; nothing resumes it and no elicitation/complete is sent for it.
    if (signal.aborted) await sidecar.cancel(created.elicitationId).catch(() => undefined);
    throw error;
  }
  if (state.outcome !== "authorized" && state.outcome !== "narrowed") {
    return { notGranted: `GitHub access was not granted (${state.outcome}).` };
  }
  // Exactly once, on this connection, with the original id: a narrowed grant completed the elicitation too.
  await client.notify(methods.client.elicitation.complete, { elicitationId: created.elicitationId });
  return { refusedScopes: state.refusedScopes };
}

/** Send `elicitation/create` with what the sidecar created; the client's answer, as the sidecar records it. */
async function askClient(
  client: AgentContext,
  sessionId: string,
  toolCallId: string,
  created: { elicitationId: string; url: string; message: string },
  signal: AbortSignal,
): Promise<Answer> {
  try {
    const response = await client.request(
      methods.client.elicitation.create,
      { sessionId, toolCallId, mode: "url", elicitationId: created.elicitationId, url: created.url, message: created.message },
      { cancellationSignal: signal }, // a cancelled turn sends $/cancel_request for this request
    );
    return { action: response.action as "accept" | "decline" | "cancel" };
  } catch (error) {
    if (signal.aborted) throw error;
    return { action: "client_error", code: error instanceof RequestError ? error.code : -32603 };
  }
}

async function listRepositories(client: AgentContext, sessionId: string, signal: AbortSignal): Promise<void> {
  const toolCallId = `call_${++toolCalls}`;
  await client.notify(methods.client.session.update, {
    sessionId,
    update: { sessionUpdate: "tool_call", toolCallId, title: "List GitHub repositories", kind: "fetch", status: "pending" },
  });
  try {
    const access = await authorize(client, sessionId, toolCallId, signal);
    if ("notGranted" in access) {
      await say(client, sessionId, access.notGranted);
      return;
    }
    if (access.refusedScopes.length > 0) {
      // Narrowed: decide whether what was granted is enough. Without `repo`, GitHub lists public repositories only.
      await say(client, sessionId, `GitHub did not grant ${access.refusedScopes.join(", ")}: only public repositories are listed.`);
    }
    const response = await sidecar.proxy("github", "user/repos", user);
    const repos = (await response.json()) as Array<{ full_name: string }>;
    await say(client, sessionId, `Your repositories: ${repos.map((repo) => repo.full_name).join(", ")}`);
    await client.notify(methods.client.session.update, {
      sessionId,
      update: { sessionUpdate: "tool_call_update", toolCallId, status: "completed" },
    });
  } catch (error) {
    await client.notify(methods.client.session.update, {
      sessionId,
      update: { sessionUpdate: "tool_call_update", toolCallId, status: "failed" },
    });
    throw error;
  }
}

const app = agent({ name: "acp-connector-ts-example" })
  .onRequest(methods.agent.initialize, ({ params }) => {
    capabilities = params.clientCapabilities;
    return { protocolVersion: PROTOCOL_VERSION, agentCapabilities: {} };
  })
  .onRequest(methods.agent.session.new, () => ({ sessionId: `sess_${crypto.randomUUID()}` }))
  .onRequest(methods.agent.session.prompt, async ({ params, client }) => {
    const turn = new AbortController();
    turns.set(params.sessionId, turn);
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
    turns.get(params.sessionId)?.abort();
  });

const connection = app.connect(
  ndJsonStream(Writable.toWeb(process.stdout) as WritableStream<Uint8Array>, Readable.toWeb(process.stdin) as ReadableStream<Uint8Array>),
);
await connection.closed;
