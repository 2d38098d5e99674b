import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { SidecarApi, events, verifyWebhook, WebhookVerificationError } from "../src/index.js";

test("the event stream resumes from the last event id after the connection breaks", async () => {
  const lastEventIds: Array<string | undefined> = [];
  const server = createServer((request, response) => {
    const last = request.headers["last-event-id"];
    lastEventIds.push(typeof last === "string" ? last : undefined);
    response.writeHead(200, { "Content-Type": "text/event-stream" });
    const next = Number(last ?? "0") + 1;
    const frame = (id: number): string =>
      `id: ${id}\nevent: elicitation\ndata: {"id": ${id}, "elicitationId": "e${id}", "status": "completed"}\n\n`;
    response.end(`retry: 2000\n\n: keep-alive\n\n${frame(next)}${frame(next + 1)}`); // then the sidecar went away
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const api = new SidecarApi({ baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, apiKey: "k" });
  const controller = new AbortController();
  const seen: number[] = [];
  for await (const event of events(api, { signal: controller.signal, backoff: { firstMs: 5, maxMs: 10 } })) {
    seen.push(event.id);
    if (seen.length === 6) controller.abort();
  }
  server.close();
  assert.deepEqual(seen, [1, 2, 3, 4, 5, 6]); // none lost, none repeated
  assert.deepEqual(lastEventIds, [undefined, "2", "4"]);
});

// Signed by the connector's Python `signed_headers` (service/core/webhooks/signing.py), so both sides agree.
const SECRET = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
const OTHER = "whsec_ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=";
const BODY =
  '{"type":"elicitation.completed","timestamp":"2023-11-14T22:13:20.000Z","data":' +
  '{"id":7,"elicitationId":"e7","status":"completed","outcome":"authorized","connectionId":"c"}}';
const SIGNED = {
  "webhook-id": "7",
  "webhook-timestamp": "1700000000",
  "webhook-signature": "v1,boWDXz+rMOFaPoc3faKFQXlpoIRaV7xn+Iby42SXgXY=",
};

test("a webhook signed by the connector verifies, also among several signatures and secrets", () => {
  const envelope = verifyWebhook(SECRET, SIGNED, BODY, { now: 1700000010 });
  assert.equal(envelope.type, "elicitation.completed");
  assert.equal(envelope.data.elicitationId, "e7");
  const rotated = { ...SIGNED, "webhook-signature": `v1,${"A".repeat(43)}= ${SIGNED["webhook-signature"]}` };
  assert.equal(verifyWebhook([OTHER, SECRET], rotated, BODY, { now: 1700000010 }).data.id, 7);
  // The earlier, non-standard form (v1=<hex>) is refused.
  const hexForm = { ...SIGNED, "webhook-signature": SIGNED["webhook-signature"].replace("v1,", "v1=") };
  assert.throws(() => verifyWebhook(SECRET, hexForm, BODY, { now: 1700000010 }), WebhookVerificationError);
});

test("a webhook with a wrong signature, body, or an old timestamp is refused", () => {
  const at = { now: 1700000010 };
  assert.throws(() => verifyWebhook(OTHER, SIGNED, BODY, at), WebhookVerificationError);
  assert.throws(() => verifyWebhook(SECRET, SIGNED, BODY.replace("e7", "e8"), at), WebhookVerificationError);
  assert.throws(() => verifyWebhook(SECRET, SIGNED, BODY, { now: 1700000000 + 301 }), /too far from now/);
  assert.throws(() => verifyWebhook(SECRET, { "webhook-id": "7" }, BODY, at), /header is missing/);
});
