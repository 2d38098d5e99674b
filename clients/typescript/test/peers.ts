// An agent using the package and an ACP client (both on the official SDK), connected in memory.
import {
  agent,
  client,
  methods,
  PROTOCOL_VERSION,
  type AnyMessage,
  type ClientApp,
  type ClientConnection,
  type CreateElicitationResponse,
} from "@agentclientprotocol/sdk";

import { SidecarConnector, type AcpLink, type AuthorizationOutcome, type AuthorizationRequest } from "../src/index.js";

export type ClientAnswer = (params: { elicitationId: string }, agentSide: ClientConnection) => Promise<unknown>;

export type Peers = {
  link: AcpLink;
  connection: ClientConnection;
  sessionId: string;
  outcomes: AuthorizationOutcome[];
  errors: unknown[];
  received: Array<{ method: string; params: unknown }>;
  prompt(): Promise<string>;
  close(): void;
};

/** The agent (whose prompt requests authorization) and a client answering `elicitation/create` with `answer`. */
export async function connect(
  baseUrl: string,
  answer: ClientAnswer,
  urlMode = true,
  more: Partial<AuthorizationRequest> = {},
): Promise<Peers> {
  const connector = new SidecarConnector({ baseUrl, apiKey: "acpk_test", backoff: { firstMs: 20, maxMs: 100 } });
  const outcomes: AuthorizationOutcome[] = [];
  const errors: unknown[] = [];
  const received: Array<{ method: string; params: unknown }> = [];
  const toAgent = new TransformStream<AnyMessage, AnyMessage>();
  const toClient = new TransformStream<AnyMessage, AnyMessage>();
  const app = agent({ name: "test-agent" })
    .onRequest(methods.agent.initialize, () => ({ protocolVersion: PROTOCOL_VERSION, agentCapabilities: {} }))
    .onRequest(methods.agent.session.new, () => ({ sessionId: `sess_${crypto.randomUUID()}` }))
    .onRequest(methods.agent.session.prompt, ({ params }) =>
      link.turn(params.sessionId, async () => {
        try {
          const outcome = await connector.requestAuthorization(link, {
            user: { issuer: "local", subject: "local-user" },
            provider: "demo",
            scope: { sessionId: params.sessionId, toolCallId: "call_1" },
            ...more,
          });
          outcomes.push(outcome);
        } catch (error) {
          errors.push(error);
          throw error;
        }
        return { stopReason: "end_turn" as const };
      }),
    )
    .onNotification(methods.agent.session.cancel, () => undefined);
  const link = connector.attach(app, { readable: toAgent.readable, writable: toClient.writable });
  const clientApp: ClientApp = client({ name: "test-client" })
    .onRequest(methods.client.elicitation.create, async ({ params }): Promise<CreateElicitationResponse> => {
      received.push({ method: "elicitation/create", params });
      return (await answer(params as { elicitationId: string }, connection)) as CreateElicitationResponse;
    })
    .onNotification(methods.client.elicitation.complete, ({ params }) => {
      received.push({ method: "elicitation/complete", params });
    })
    .onNotification(methods.client.session.update, () => undefined)
    .onNotification("$/cancel_request", { parse: (value: unknown) => value }, ({ params }) => {
      received.push({ method: "$/cancel_request", params });
    });
  const connection: ClientConnection = clientApp.connect({ readable: toClient.readable, writable: toAgent.writable });
  await connection.agent.request(methods.agent.initialize, {
    protocolVersion: PROTOCOL_VERSION,
    clientCapabilities: urlMode ? { elicitation: { url: {} } } : {},
  });
  const { sessionId } = await connection.agent.request(methods.agent.session.new, { cwd: "/", mcpServers: [] });
  return {
    link,
    connection,
    sessionId,
    outcomes,
    errors,
    received,
    async prompt() {
      const response = await connection.agent.request(methods.agent.session.prompt, {
        sessionId,
        prompt: [{ type: "text", text: "go" }],
      });
      return response.stopReason;
    },
    close() {
      connection.close();
      link.connection.close();
    },
  };
}

export async function until(check: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}
