// The example MCP server in TypeScript (stdio), on the official @modelcontextprotocol/sdk: two tools that list the
// user's repositories through a sidecar connector, never seeing a token. `list_repositories` asks with a URL-mode
// elicitation and waits; `list_repositories_after_retry` answers -32042 and is called again. The user is the one local
// user this server runs for (MCP_SERVER_USER_ISSUER / MCP_SERVER_USER_SUBJECT), never something the client sends.

import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { McpAuthorization, type Outcome } from "./mcp.js";
import { Sidecar, type Ask, type User } from "./sidecar.js";

const env = process.env;
const sidecar = new Sidecar(env.SIDECAR_URL ?? "http://127.0.0.1:8700", env.SIDECAR_API_KEY ?? "");
const provider = env.MCP_SERVER_PROVIDER ?? "github";
const user: User = { issuer: env.MCP_SERVER_USER_ISSUER ?? "local", subject: env.MCP_SERVER_USER_SUBJECT ?? "local-user" };

const server = new McpServer({ name: "repositories-example-ts", version: "0.1.0" });
const authorization = new McpAuthorization(server.server, sidecar);

const text = (value: string): CallToolResult => ({ content: [{ type: "text", text: value }] });

async function listing(outcome: Outcome): Promise<CallToolResult> {
  if (!["authorized", "already_authorized", "narrowed"].includes(outcome.status)) {
    return text(`No access to ${provider}: ${outcome.status}${outcome.reason ? ` (${outcome.reason})` : ""}.`);
  }
  const answer = await sidecar.proxy(user, provider, "user/repos?per_page=100");
  if (!answer.ok) return text(`The provider answered HTTP ${answer.status}.`);
  const repos = (await answer.json()) as { full_name?: string; name?: string }[];
  return text(["Your repositories:", ...repos.map((r) => `- ${r.full_name ?? r.name}`)].join("\n"));
}

function ask(requestId: string | number): Ask {
  return { user, provider, scope: { requestId } };
}

server.registerTool(
  "list_repositories",
  { description: "List the user's repositories; asks for access in the browser first when it is not granted yet." },
  async (extra) => listing(await authorization.request(ask(extra.requestId), extra.requestId, extra.signal)),
);

server.registerTool(
  "list_repositories_after_retry",
  { description: "List the user's repositories; without access the call fails with -32042 (open the URL, retry)." },
  async (extra) => listing(await authorization.require(ask(extra.requestId))),
);

await server.connect(new StdioServerTransport());
