// An ACP agent over stdio whose one tool lists the user's repositories at a provider (`demo` under `make run`),
// through an acp-connector sidecar: `@acp-connector/client` asks for the user's authorization with a URL-mode
// elicitation and calls the provider through the sidecar's token proxy; this agent never sees a token.
// Environment: SIDECAR_URL, SIDECAR_API_KEY, AGENT_USER_ISSUER, AGENT_USER_SUBJECT (the user this agent acts for,
// as its own sign-in verified them), PROVIDER (default `demo`).
import { Readable, Writable } from "node:stream";

import { agent, methods, ndJsonStream, PROTOCOL_VERSION } from "@agentclientprotocol/sdk";
import type { SessionUpdate } from "@agentclientprotocol/sdk";
import { AuthorizationCancelled, SidecarConnector, SidecarUnavailableError } from "@acp-connector/client";

const connector = new SidecarConnector({ baseUrl: required("SIDECAR_URL"), apiKey: required("SIDECAR_API_KEY") });
const user = { issuer: required("AGENT_USER_ISSUER"), subject: required("AGENT_USER_SUBJECT") };
const provider = process.env.PROVIDER || "demo";
let toolCalls = 0;

function required(name: string): string {
  const value = process.env[name];
  if (!value) {
    console.error(`ts-agent: set ${name}`);
    process.exit(2);
  }
  return value;
}

/** A session update, unless the connection has closed (nobody is left to tell). */
async function update(sessionId: string, change: SessionUpdate): Promise<void> {
  if (!link.closed) await link.client.notify(methods.client.session.update, { sessionId, update: change });
}

/** End the tool call with a sentence for the user, and say it. */
async function finish(sessionId: string, toolCallId: string, text: string, ok: boolean): Promise<void> {
  const content = [{ type: "content" as const, content: { type: "text" as const, text } }];
  await update(sessionId, { sessionUpdate: "tool_call_update", toolCallId, status: ok ? "completed" : "failed", content });
  await update(sessionId, { sessionUpdate: "agent_message_chunk", content: { type: "text", text } });
}

async function listRepositories(sessionId: string): Promise<void> {
  const toolCallId = `call_${++toolCalls}`;
  await update(sessionId, { sessionUpdate: "tool_call", toolCallId, title: "List repositories", kind: "fetch", status: "pending" });
  try {
    const outcome = await connector.requestAuthorization(link, {
      user,
      provider,
      scopes: ["repo"],
      scope: { sessionId, toolCallId },
    });
    if (!outcome.ok && outcome.status !== "narrowed") return finish(sessionId, toolCallId, outcome.describe(), false);
    if (outcome.status === "narrowed") {
      // Decide whether what was granted is enough: without `repo`, only public repositories are listed.
      const text = `${outcome.providerDisplayName} did not grant ${outcome.refusedScopes.join(", ")}: only public repositories are listed.`;
      await update(sessionId, { sessionUpdate: "agent_message_chunk", content: { type: "text", text } });
    }
    const response = await connector.fetch(user, provider, "user/repos");
    if (!response.ok) return finish(sessionId, toolCallId, `The provider answered HTTP ${response.status}.`, false);
    const repos = (await response.json()) as Array<{ full_name: string }>;
    await finish(sessionId, toolCallId, `Your repositories: ${repos.map((repo) => repo.full_name).join(", ")}`, true);
  } catch (error) {
    // The sidecar stayed away until the request expired: its message says so in words for the user.
    if (error instanceof SidecarUnavailableError) return finish(sessionId, toolCallId, error.message, false);
    const text = error instanceof AuthorizationCancelled ? error.message : "The tool failed.";
    await update(sessionId, { sessionUpdate: "tool_call_update", toolCallId, status: "failed", content: [{ type: "content", content: { type: "text", text } }] }).catch(() => undefined);
    throw error; // a cancelled turn is answered `cancelled` by link.turn
  }
}

const app = agent({ name: "acp-connector-ts-example" })
  .onRequest(methods.agent.initialize, () => ({ protocolVersion: PROTOCOL_VERSION, agentCapabilities: {} }))
  .onRequest(methods.agent.session.new, () => ({ sessionId: `sess_${crypto.randomUUID()}` }))
  // `cancelled` whenever the turn was cancelled (session/cancel, or $/cancel_request for the prompt).
  .onRequest(methods.agent.session.prompt, ({ params }) =>
    link.turn(params.sessionId, async () => {
      await listRepositories(params.sessionId);
      return { stopReason: "end_turn" as const };
    }),
  )
  .onNotification(methods.agent.session.cancel, () => undefined); // the link saw it first and stopped the turn

// The link sees every message before the SDK: the client's capabilities, its cancellations, the connection's end.
const link = connector.attach(
  app,
  ndJsonStream(Writable.toWeb(process.stdout) as WritableStream<Uint8Array>, Readable.toWeb(process.stdin) as ReadableStream<Uint8Array>),
);
await link.connection.closed;
