// An MCP client on the official TypeScript SDK for trying the example server (and for its tests): it connects over
// stdio (starting `dist/server.js`) or to a streamable HTTP server (`--http URL`, the bearer in MCP_BEARER), runs
// the steps it is given and reports what happened as JSON lines on stdout:
//   {"event":"elicitation","params":{...}}   asked (URL mode); answered with the step's action
//   {"event":"url_required","data":{...}}    the call failed with -32042; the client waits for the completion, retries
//   {"event":"complete","elicitationId":...} notifications/elicitation/complete arrived
//   {"event":"result","text":"..."}          a tool's answer
//   {"event":"paused"}                       waiting for a line on stdin (the step `pause`)
// Every message on the MCP wire, both ways, goes to WIRE_LOG (a file, JSON lines) when it is set.
//   node dist/client.js [--http URL] [--form-only] [STEP ...]
// A step is TOOL[:ACTION] (ACTION: accept, decline or cancel; default accept) or `pause`; without steps,
// `list_repositories:accept`.

import { appendFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js";
import type { JSONRPCMessage } from "@modelcontextprotocol/sdk/types.js";
import {
  ElicitRequestSchema,
  ElicitationCompleteNotificationSchema,
  ErrorCode,
  McpError,
} from "@modelcontextprotocol/sdk/types.js";

const args = process.argv.slice(2);
const option = (name: string): string | undefined => {
  const at = args.indexOf(name);
  return at < 0 ? undefined : args.splice(at, 2)[1];
};
const httpUrl = option("--http");
const formOnly = args.includes("--form-only");
const steps = args.filter((a) => a !== "--form-only");
if (steps.length === 0) steps.push("list_repositories:accept");

const say = (event: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(event)}\n`);
const wireLog = process.env.WIRE_LOG;
const record = (direction: string, message: JSONRPCMessage) => {
  if (wireLog) appendFileSync(wireLog, `${JSON.stringify({ direction, message })}\n`);
};
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

const client = new Client(
  { name: "connector-test-client", version: "0.1.0" },
  { capabilities: { elicitation: formOnly ? {} : { url: {} } } },
);
let action: "accept" | "decline" | "cancel" = "accept";
const completions: string[] = [];
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  say({ event: "elicitation", params: request.params });
  return { action };
});
client.setNotificationHandler(ElicitationCompleteNotificationSchema, async (notification) => {
  say({ event: "complete", elicitationId: notification.params.elicitationId });
  completions.push(notification.params.elicitationId);
});

function transport(): Transport {
  if (httpUrl !== undefined) {
    const headers: Record<string, string> = process.env.MCP_BEARER ? { Authorization: `Bearer ${process.env.MCP_BEARER}` } : {};
    return new StreamableHTTPClientTransport(new URL(httpUrl), { requestInit: { headers } });
  }
  const env: Record<string, string> = {};
  for (const [key, value] of Object.entries(process.env)) if (value !== undefined) env[key] = value;
  return new StdioClientTransport({ command: process.execPath, args: ["dist/server.js", "stdio"], env, stderr: "inherit" });
}

const wire = transport();
const send = wire.send.bind(wire);
wire.send = async (message, options) => {
  record("out", message);
  return send(message, options);
};
await client.connect(wire);
const onmessage = wire.onmessage;
wire.onmessage = (message, extra) => {
  record("in", message);
  onmessage?.(message, extra);
};

async function call(tool: string): Promise<void> {
  const result = await client.callTool({ name: tool, arguments: {} }, undefined, { timeout: 600_000 });
  const blocks = (result.content ?? []) as { type: string; text?: string }[];
  say({ event: "result", text: blocks.map((b) => b.text ?? "").join("\n") });
}

async function completed(elicitationId: string): Promise<void> {
  while (!completions.includes(elicitationId)) await new Promise((resolve) => setTimeout(resolve, 20));
}

for (const step of steps) {
  if (step === "pause") {
    say({ event: "paused" });
    await lines.next();
    continue;
  }
  const [tool = "list_repositories", answer = "accept"] = step.split(":");
  action = answer as typeof action;
  try {
    await call(tool);
  } catch (error) {
    if (!(error instanceof McpError) || error.code !== ErrorCode.UrlElicitationRequired) throw error;
    say({ event: "url_required", data: error.data });
    const [required] = (error.data as { elicitations: { elicitationId: string }[] }).elicitations;
    // The user finishes in the browser; the server tells it with notifications/elicitation/complete; then retry.
    if (required !== undefined) await completed(required.elicitationId);
    await call(tool);
  }
}
await client.close();
process.exit(0);
