// The example MCP server in TypeScript, on the official @modelcontextprotocol/sdk, with @acp-connector/client/mcp
// talking to a sidecar connector (/v1): `node dist/server.js [stdio|http]`.
//   stdio: the user is the one local user this process runs for (MCP_SERVER_USER_ISSUER / MCP_SERVER_USER_SUBJECT);
//   http:  streamable HTTP on MCP_SERVER_HOST:MCP_SERVER_PORT/mcp, the user from the verified bearer
//          (MCP_SERVER_AUTH_ISSUER, MCP_SERVER_AUTH_JWKS: a JWKS URL or file).

import { McpConnector, type User } from "@acp-connector/client/mcp";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { serveHttp } from "./http.js";
import { repositoriesServer, type Settings } from "./tools.js";

const env = process.env;
const connector = new McpConnector({ baseUrl: env.SIDECAR_URL ?? "http://127.0.0.1:8700", apiKey: env.SIDECAR_API_KEY ?? "" });
const scopes = (env.MCP_SERVER_SCOPES ?? "").replaceAll(",", " ").split(" ").filter(Boolean);
const settings: Settings = { provider: env.MCP_SERVER_PROVIDER ?? "github", ...(scopes.length ? { scopes } : {}) };
const transport = process.argv[2] ?? "stdio";
if (!env.SIDECAR_API_KEY) {
  process.stderr.write("set SIDECAR_API_KEY (acp-connector api-keys create --tenant mcp-ts-example)\n");
  process.exit(2);
}

if (transport === "stdio") {
  const user: User = { issuer: env.MCP_SERVER_USER_ISSUER ?? "local", subject: env.MCP_SERVER_USER_SUBJECT ?? "local-user" };
  await repositoriesServer(connector, settings, () => user).connect(new StdioServerTransport());
} else if (transport === "http") {
  if (!env.MCP_SERVER_AUTH_ISSUER || !env.MCP_SERVER_AUTH_JWKS) {
    process.stderr.write("http: set MCP_SERVER_AUTH_ISSUER and MCP_SERVER_AUTH_JWKS (the authorization server)\n");
    process.exit(2);
  }
  await serveHttp(connector, {
    ...settings,
    host: env.MCP_SERVER_HOST ?? "127.0.0.1",
    port: Number(env.MCP_SERVER_PORT ?? "8710"),
    authIssuer: env.MCP_SERVER_AUTH_ISSUER ?? "",
    authJwks: env.MCP_SERVER_AUTH_JWKS ?? "",
  });
} else {
  process.stderr.write("usage: node dist/server.js [stdio|http]\n");
  process.exit(2);
}
