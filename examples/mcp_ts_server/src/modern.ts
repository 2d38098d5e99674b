// The example's tools at protocol 2026-07-28 (stdio), on the official SDK's v2 packages
// (@modelcontextprotocol/server 2.4.0): `@modelcontextprotocol/sdk` 1.x, which `server.ts` runs on, has no
// 2026-07-28. There is no server-to-client request and no completion notification: the first call answers
// `input_required` with the URL-mode elicitation (no elicitationId) and a `requestState` naming the round
// (`McpConnector.round`); the client asks its user and calls again with the answer, and that call waits for the
// browser. -32042 does not exist at 2026-07-28, so `list_repositories_after_retry` asks the same way. This entry
// serves 2026-07-28 clients only (`legacy: "reject"`); 2025-era clients use `dist/server.js`.
//   node dist/modern.js          (SIDECAR_URL, SIDECAR_API_KEY, MCP_SERVER_USER_ISSUER / _SUBJECT, MCP_SERVER_PROVIDER)

import { AuthorizationOutcome, McpConnector, type User } from "@acp-connector/client/mcp";
import { inputRequired, McpServer, type CallToolResult, type ServerContext } from "@modelcontextprotocol/server";
import { serveStdio } from "@modelcontextprotocol/server/stdio";

const env = process.env;
if (!env.SIDECAR_API_KEY) {
  process.stderr.write("set SIDECAR_API_KEY (acp-connector api-keys create --tenant mcp-ts-example)\n");
  process.exit(2);
}
const connector = new McpConnector({ baseUrl: env.SIDECAR_URL ?? "http://127.0.0.1:8700", apiKey: env.SIDECAR_API_KEY });
const provider = env.MCP_SERVER_PROVIDER ?? "github";
const user: User = { issuer: env.MCP_SERVER_USER_ISSUER ?? "local", subject: env.MCP_SERVER_USER_SUBJECT ?? "local-user" };
const CAPABILITIES = "io.modelcontextprotocol/clientCapabilities";

const text = (value: string): CallToolResult => ({ content: [{ type: "text", text: value }] });

async function listRepositories(ctx: ServerContext) {
  // At 2026-07-28 the client's capabilities ride each request's _meta envelope.
  const envelope = (ctx.mcpReq.envelope ?? {}) as Record<string, unknown>;
  const capabilities = envelope[CAPABILITIES] as { elicitation?: unknown } | undefined;
  const state = ctx.mcpReq.requestState<unknown>();
  const outcome = await connector.round(
    { connectionId: "", capabilities: () => capabilities ?? {} },
    { user, provider, requestId: ctx.mcpReq.id, signal: ctx.mcpReq.signal },
    { requestState: typeof state === "string" ? state : undefined, inputResponses: ctx.mcpReq.inputResponses },
  );
  if (!(outcome instanceof AuthorizationOutcome)) {
    const { message, url } = outcome.inputRequests.authorization.params;
    return inputRequired({
      inputRequests: { authorization: inputRequired.elicitUrl({ message, url }) },
      requestState: outcome.requestState,
    });
  }
  if (!["authorized", "already_authorized", "narrowed"].includes(outcome.status)) return text(outcome.describe());
  const answer = await connector.fetch(user, provider, "user/repos?per_page=100");
  if (!answer.ok) return text(`The provider answered HTTP ${answer.status}.`);
  const repos = (await answer.json()) as { full_name?: string; name?: string }[];
  return text(["Your repositories:", ...repos.map((r) => `- ${r.full_name ?? r.name}`)].join("\n"));
}

serveStdio(
  () => {
    const server = new McpServer({ name: "repositories-example-ts", version: "0.1.0" });
    const description = "List the user's repositories; asks for access in the browser first when it is not granted yet.";
    server.registerTool("list_repositories", { description }, listRepositories);
    server.registerTool("list_repositories_after_retry", { description }, listRepositories);
    return server;
  },
  { legacy: "reject" },
);
