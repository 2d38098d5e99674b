// The example on streamable HTTP (stateful: one MCP session per client, each with its own server and connection
// key, all in this one process), behind MCP's own authorization: every request needs a bearer the verifier accepts,
// and a session stays with the user who opened it.

import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { McpConnector } from "@acp-connector/client/mcp";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { JwtVerifier, userOf } from "./auth.js";
import { repositoriesServer, type Settings } from "./tools.js";

export type HttpSettings = Settings & { host: string; port: number; authIssuer: string; authJwks: string };

async function body(request: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  for await (const chunk of request) chunks.push(chunk as Buffer);
  if (chunks.length === 0) return undefined;
  try {
    return JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch {
    return null;
  }
}

export function serveHttp(connector: McpConnector, settings: HttpSettings): Promise<void> {
  const resource = `http://${settings.host}:${settings.port}/mcp`;
  const verifier = new JwtVerifier(settings.authIssuer, resource, settings.authJwks);
  const sessions = new Map<string, { transport: StreamableHTTPServerTransport; owner: string }>();
  const refuse = (response: ServerResponse, status: number, code: string, message: string) => {
    const headers: Record<string, string> = { "Content-Type": "application/json" };
    if (status === 401) headers["WWW-Authenticate"] = `Bearer error="invalid_token", error_description="${message}"`;
    response.writeHead(status, headers).end(JSON.stringify({ error: code, error_description: message }));
  };

  const server = createServer((request, response) => {
    void (async () => {
      if (new URL(request.url ?? "/", resource).pathname !== "/mcp") return refuse(response, 404, "not_found", "Not here.");
      const auth = await verifier.verify(request.headers.authorization);
      if (auth === undefined) return refuse(response, 401, "invalid_token", "A valid bearer token is required.");
      const user = userOf(auth);
      const owner = `${user.issuer} ${user.subject}`;
      const parsed = request.method === "POST" ? await body(request) : undefined;
      const sessionId = request.headers["mcp-session-id"];
      const open = typeof sessionId === "string" ? sessions.get(sessionId) : undefined;
      if (open !== undefined) {
        if (open.owner !== owner) return refuse(response, 403, "wrong_user", "This session belongs to another user.");
        return open.transport.handleRequest(Object.assign(request, { auth }), response, parsed);
      }
      if (sessionId !== undefined || request.method !== "POST" || !isInitializeRequest(parsed)) {
        return refuse(response, sessionId === undefined ? 400 : 404, "no_session", "Initialize a session first.");
      }
      const transport: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => crypto.randomUUID(),
        onsessioninitialized: (id) => void sessions.set(id, { transport, owner }),
      });
      transport.onclose = () => {
        if (transport.sessionId !== undefined) sessions.delete(transport.sessionId);
      };
      const mcp = repositoriesServer(connector, settings, (extra) => userOf(extra.authInfo));
      await mcp.connect(transport);
      await transport.handleRequest(Object.assign(request, { auth }), response, parsed);
    })().catch((error: unknown) => {
      process.stderr.write(`request failed: ${error instanceof Error ? error.name : "error"}\n`);
      if (!response.headersSent) refuse(response, 500, "server_error", "The request failed.");
    });
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(settings.port, settings.host, () => {
      process.stderr.write(`MCP server at ${resource}\n`);
      resolve();
    });
  });
}
