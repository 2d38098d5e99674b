// The Standard Webhooks reference library for JavaScript (npm `standardwebhooks`) verifying deliveries the test
// received from the connector. Usage: node verify_webhooks.mjs < cases.json
// stdin: a JSON array of {"secret": "whsec_...", "headers": {...}, "body": "<base64 of the raw body>"};
// stdout: a JSON array, one answer per case: {"ok": <the parsed body>} or {"error": "<the library's message>"}.
import { Webhook } from "standardwebhooks";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const cases = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const answers = cases.map(({ secret, headers, body }) => {
  try {
    return { ok: new Webhook(secret).verify(Buffer.from(body, "base64"), headers) };
  } catch (error) {
    return { error: `${error.name}: ${error.message}` };
  }
});
process.stdout.write(JSON.stringify(answers) + "\n");
