// An ACP agent over stdio whose one tool lists the user's GitHub repositories. It asks for the user's
// authorization with a URL-mode elicitation that a sidecar connector created, and calls GitHub through the
// sidecar's token proxy. Environment: SIDECAR_URL, SIDECAR_API_KEY, AGENT_USER_ISSUER, AGENT_USER_SUBJECT
// (the user this agent acts for, as its own sign-in verified them).
import { Readable, Writable } from "node:stream";

import { agent, methods, ndJsonStream, RequestError, PROTOCOL_VERSION } from "@agentclientprotocol/sdk";
import type { AgentContext, ClientCapabilities } from "@agentclientprotocol/sdk";

import { Sidecar, type Answer, type User } from "./sidecar.js";

const sidecar = new Sidecar(required("SIDECAR_URL"), required("SIDECAR_API_KEY"));
const user: User = { issuer: required("AGENT_USER_ISSUER"), subject: required("AGENT_USER_SUBJECT") };
const connectionId = crypto.randomUUID(); // events and states name this connection

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

/** Make sure the user has authorized GitHub: null when a grant exists now, else a sentence saying why not. */
async function authorize(client: AgentContext, sessionId: string, toolCallId: string, signal: AbortSignal): Promise<string | null> {
  if (!urlModeAdvertised()) {
    // Nothing is sent to such a client (never a form instead); a grant the user already gave still works.
    const grants = await sidecar.grants(user, "github");
    if (grants.some((grant) => grant.scopes.includes("repo"))) return null;
    return "This client cannot open authorization links (no URL-mode elicitation), so GitHub access cannot be requested here.";
  }
  const created = await sidecar.createElicitation({
    user,
    provider: "github",
    scopes: ["repo"],
    scope: { sessionId, toolCallId },
    connectionId,
  });
  if (created.status === "already_authorized") return null;
  let answer: Answer;
  try {
    const response = await client.request(
      methods.client.elicitation.create,
      { sessionId, toolCallId, mode: "url", elicitationId: created.elicitationId, url: created.url, message: created.message },
      { cancellationSignal: signal }, // a cancelled turn sends $/cancel_request for this request
    );
    answer = { action: response.action as "accept" | "decline" | "cancel" };
  } catch (error) {
    if (signal.aborted) {
      await sidecar.cancel(created.elicitationId).catch(() => undefined);
      throw error;
    }
    answer = { action: "client_error", code: error instanceof RequestError ? error.code : -32603 };
  }
  const answered = await sidecar.answer(created.elicitationId, answer);
  const state = answer.action === "accept" ? await sidecar.ended(created.elicitationId, signal) : answered;
  if (state.outcome !== "authorized") return `GitHub access was not granted (${state.outcome}).`;
  // Exactly once, on this connection, with the original id.
  await client.notify(methods.client.elicitation.complete, { elicitationId: created.elicitationId });
  return null;
}

async function listRepositories(client: AgentContext, sessionId: string, signal: AbortSignal): Promise<void> {
  const toolCallId = `call_${++toolCalls}`;
  await client.notify(methods.client.session.update, {
    sessionId,
    update: { sessionUpdate: "tool_call", toolCallId, title: "List GitHub repositories", kind: "fetch", status: "pending" },
  });
  try {
    const refused = await authorize(client, sessionId, toolCallId, signal);
    if (refused !== null) {
      await say(client, sessionId, refused);
      return;
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
