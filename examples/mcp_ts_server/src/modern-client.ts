// An MCP client on the official SDK's v2 packages (@modelcontextprotocol/client 2.4.0) pinned to protocol
// 2026-07-28: it starts `dist/modern.js` over stdio, runs its steps (TOOL[:accept|decline|cancel], default
// `list_repositories:accept`) and reports as `client.ts` does, as JSON lines on stdout:
//   {"event":"elicitation","params":{...}}   the SDK met an input_required result and asks (URL mode)
//   {"event":"result","text":"..."}          the tool's answer, after the SDK's retry with the answer
// Every message on the MCP wire, both ways, goes to WIRE_LOG (a file, JSON lines) when it is set.
//   node dist/modern-client.js [--form-only] [STEP ...]

import { appendFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";

const args = process.argv.slice(2);
const formOnly = args.includes("--form-only");
const steps = args.filter((a) => a !== "--form-only");
if (steps.length === 0) steps.push("list_repositories:accept");
const say = (event: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(event)}\n`);
const record = (direction: string, message: unknown) => {
  if (process.env.WIRE_LOG) appendFileSync(process.env.WIRE_LOG, `${JSON.stringify({ direction, message })}\n`);
};

const client = new Client(
  { name: "connector-test-client", version: "0.1.0" },
  {
    capabilities: { elicitation: formOnly ? {} : { url: {} } },
    versionNegotiation: { mode: { pin: "2026-07-28" } },
  },
);
let action: "accept" | "decline" | "cancel" = "accept";
client.setRequestHandler("elicitation/create", async (request) => {
  say({ event: "elicitation", params: request.params });
  return { action };
});

const env: Record<string, string> = {};
for (const [key, value] of Object.entries(process.env)) if (value !== undefined) env[key] = value;
const wire = new StdioClientTransport({ command: process.execPath, args: ["dist/modern.js"], env, stderr: "inherit" });
const send = wire.send.bind(wire);
wire.send = async (message) => {
  record("out", message);
  return send(message);
};
await client.connect(wire);
const onmessage = wire.onmessage;
wire.onmessage = (...received) => {
  record("in", received[0]);
  onmessage?.(...received);
};
say({ event: "connected", era: client.getProtocolEra() });

for (const step of steps) {
  const [tool = "list_repositories", answer = "accept"] = step.split(":");
  action = answer as typeof action;
  const result = await client.callTool({ name: tool, arguments: {} }, { timeout: 600_000 });
  const blocks = (result.content ?? []) as { type: string; text?: string }[];
  say({ event: "result", text: blocks.map((b) => b.text ?? "").join("\n") });
}
await client.close();
process.exit(0);
