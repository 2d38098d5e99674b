// The MCP wire for @acp-connector/client/mcp, on the official SDK (1.x, protocol 2025-11-25): the package decides
// (stored grants, URL mode by MCP's rule, waiting, the once-only completion) and asks this peer to send. The
// elicitation goes out on the tool call's own stream (`relatedRequestId`), so on streamable HTTP it rides the POST
// being answered; the completion too while the call waits, and on the connection otherwise (the -32042 path).

import type { McpPeer } from "@acp-connector/client/mcp";
import type { Server } from "@modelcontextprotocol/sdk/server/index.js";
import type { RequestId } from "@modelcontextprotocol/sdk/types.js";

/** One client connection (stdio: the process; HTTP: one session): its key at the sidecar and whether it closed. */
export class Connection {
  readonly id = `mcp-ts-${crypto.randomUUID()}`;
  private readonly closing = new AbortController();

  constructor(readonly server: Server) {
    const previous = server.onclose;
    server.onclose = () => {
      this.closing.abort();
      previous?.();
    };
  }

  /** The peer for one tool call (`requestId`). */
  peer(requestId: RequestId): McpPeer {
    const server = this.server;
    return {
      connectionId: this.id,
      closed: this.closing.signal,
      capabilities: () => server.getClientCapabilities(),
      elicit: async (params, signal) =>
        // a person is on the other end: an hour, not the SDK's default minute
        (await server.elicitInput(params, { relatedRequestId: requestId, signal, timeout: 3_600_000 })) as Record<
          string,
          unknown
        >,
      notify: (notification, duringCall) =>
        server.createElicitationCompletionNotifier(
          notification.params.elicitationId,
          duringCall ? { relatedRequestId: requestId } : undefined,
        )(),
    };
  }
}
