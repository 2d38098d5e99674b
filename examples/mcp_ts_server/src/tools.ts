// The example's two tools, which list the user's repositories through the sidecar and never see a token:
// `list_repositories` asks on the call (URL-mode elicitation) and waits for the browser; `list_repositories_after_retry`
// answers -32042 (URL elicitation required) and is called again. The user comes from `userOf`: the one local user on
// stdio, the verified bearer's subject on streamable HTTP; never from anything the client sends.

import { McpConnector, UrlElicitationRequired, type AuthorizationOutcome, type User } from "@acp-connector/client/mcp";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { RequestHandlerExtra } from "@modelcontextprotocol/sdk/shared/protocol.js";
import type { CallToolResult, ServerNotification, ServerRequest } from "@modelcontextprotocol/sdk/types.js";
import { UrlElicitationRequiredError } from "@modelcontextprotocol/sdk/types.js";
import { Connection } from "./peer.js";

export type Extra = RequestHandlerExtra<ServerRequest, ServerNotification>;
export type Settings = { provider: string; scopes?: string[] };

const text = (value: string): CallToolResult => ({ content: [{ type: "text", text: value }] });

/** A server with the two tools (one per stdio process, one per HTTP session). */
export function repositoriesServer(connector: McpConnector, settings: Settings, userOf: (extra: Extra) => User): McpServer {
  const server = new McpServer({ name: "repositories-example-ts", version: "0.1.0" });
  const connection = new Connection(server.server);
  const ask = (extra: Extra) => ({
    user: userOf(extra),
    provider: settings.provider,
    ...(settings.scopes ? { scopes: settings.scopes } : {}),
    requestId: extra.requestId,
    signal: extra.signal,
  });

  async function listing(user: User, outcome: AuthorizationOutcome): Promise<CallToolResult> {
    if (!["authorized", "already_authorized", "narrowed"].includes(outcome.status)) return text(outcome.describe());
    const answer = await connector.fetch(user, settings.provider, "user/repos?per_page=100");
    if (!answer.ok) return text(`The provider answered HTTP ${answer.status}.`);
    const repos = (await answer.json()) as { full_name?: string; name?: string }[];
    return text(["Your repositories:", ...repos.map((r) => `- ${r.full_name ?? r.name}`)].join("\n"));
  }

  server.registerTool(
    "list_repositories",
    { description: "List the user's repositories; asks for access in the browser first when it is not granted yet." },
    async (extra) => {
      const request = ask(extra);
      return listing(request.user, await connector.requestAuthorization(connection.peer(extra.requestId), request));
    },
  );

  server.registerTool(
    "list_repositories_after_retry",
    { description: "List the user's repositories; without access the call fails with -32042 (open the URL, retry)." },
    async (extra) => {
      const request = ask(extra);
      try {
        return listing(request.user, await connector.requireAuthorization(connection.peer(extra.requestId), request));
      } catch (error) {
        // The SDK answers a tool call with a JSON-RPC error only for its own -32042 error.
        if (error instanceof UrlElicitationRequired) throw new UrlElicitationRequiredError(error.data.elicitations);
        throw error;
      }
    },
  );
  return server;
}
