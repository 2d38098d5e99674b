// An MCP client on the official TypeScript SDK that starts the example server over stdio, calls one tool and reports
// what happened as JSON lines on stdout (the tests read them and do the browser step):
//   {"event":"elicitation","params":{...}}   asked (URL mode); answered with ACTION
//   {"event":"url_required","data":{...}}    the call failed with -32042; the client waits for the completion, retries
//   {"event":"complete","elicitationId":...} notifications/elicitation/complete arrived
//   {"event":"result","text":"..."}          the tool's answer
// Every message on the MCP wire, both ways, goes to WIRE_LOG (a file, JSON lines).
//   node dist/client.js TOOL ACTION [--form-only]

import { appendFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import type { JSONRPCMessage } from "@modelcontextprotocol/sdk/types.js";
import {
  ElicitRequestSchema,
  ElicitationCompleteNotificationSchema,
  ErrorCode,
  McpError,
} from "@modelcontextprotocol/sdk/types.js";

const [tool = "list_repositories", action = "accept", ...flags] = process.argv.slice(2);
const formOnly = flags.includes("--form-only");
const say = (event: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(event)}\n`);
const wireLog = process.env.WIRE_LOG;
const record = (direction: string, message: JSONRPCMessage) => {
  if (wireLog) appendFileSync(wireLog, `${JSON.stringify({ direction, message })}\n`);
};

const client = new Client(
  { name: "connector-test-client", version: "0.1.0" },
  { capabilities: { elicitation: formOnly ? {} : { url: {} } } },
);
let completed: () => void = () => undefined;
const completion = new Promise<void>((resolve) => (completed = resolve));
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  say({ event: "elicitation", params: request.params });
  return { action: action as "accept" | "decline" | "cancel" };
});
client.setNotificationHandler(ElicitationCompleteNotificationSchema, async (notification) => {
  say({ event: "complete", elicitationId: notification.params.elicitationId });
  completed();
});

const env: Record<string, string> = {};
for (const [key, value] of Object.entries(process.env)) if (value !== undefined) env[key] = value;
const transport = new StdioClientTransport({ command: process.execPath, args: ["dist/server.js"], env, stderr: "inherit" });
const send = transport.send.bind(transport);
transport.send = async (message: JSONRPCMessage) => {
  record("out", message);
  return send(message);
};
await client.connect(transport);
const onmessage = transport.onmessage;
transport.onmessage = (message: JSONRPCMessage) => {
  record("in", message);
  onmessage?.(message);
};

async function call(): Promise<void> {
  const result = await client.callTool({ name: tool, arguments: {} }, undefined, { timeout: 600_000 });
  const blocks = (result.content ?? []) as { type: string; text?: string }[];
  say({ event: "result", text: blocks.map((b) => b.text ?? "").join("\n") });
}

try {
  await call();
} catch (error) {
  if (!(error instanceof McpError) || error.code !== ErrorCode.UrlElicitationRequired) throw error;
  say({ event: "url_required", data: error.data });
  await completion; // the user finishes in the browser; then the call is made again
  await call();
}
await client.close();
