// The ACP side of the package against a sidecar in memory: what the client receives and what the sidecar is told.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { methods } from "@agentclientprotocol/sdk";

import { AuthorizationCancelled, SidecarUnavailableError } from "../src/index.js";
import { FakeSidecar } from "./fake-sidecar.js";
import { connect, until } from "./peers.js";

const sidecar = new FakeSidecar();
before(() => sidecar.start());
after(() => sidecar.kill());

function fresh(): void {
  sidecar.elicitations.clear();
  sidecar.created.length = 0;
  sidecar.ttlMs = 60_000;
}

test("session/cancel racing the client's own cancel answer: every turn is answered cancelled, with the cause", async () => {
  for (let trial = 0; trial < 25; trial++) {
    fresh();
    const peers = await connect(sidecar.baseUrl, async (_params, connection) => {
      // As clients that dismiss their UI on cancel: session/cancel, and at the same moment the answer.
      await connection.agent.notify(methods.agent.session.cancel, { sessionId: peers.sessionId });
      return { action: "cancel" };
    });
    assert.equal(await peers.prompt(), "cancelled", `trial ${trial}`);
    const found = sidecar.only();
    assert.deepEqual(found.cancels, [{ cause: "session_cancel", requestCancelled: true }], `trial ${trial}`);
    assert.deepEqual(found.answers, []);
    assert.equal(peers.received.filter((m) => m.method === "$/cancel_request").length, 1);
    assert.ok(peers.errors[0] instanceof AuthorizationCancelled);
    assert.equal(peers.received.filter((m) => m.method === "elicitation/complete").length, 0);
    peers.close();
  }
});

test("a refusal with _meta.message is reported with its reason and read back as refused", async () => {
  fresh();
  const reason = "elicitation mode is not supported";
  const peers = await connect(sidecar.baseUrl, () => Promise.resolve({ action: "cancel", _meta: { message: reason } }));
  assert.equal(await peers.prompt(), "end_turn");
  assert.deepEqual(sidecar.only().answers, [{ action: "cancel", message: reason }]);
  const [outcome] = peers.outcomes;
  assert.equal(outcome?.status, "refused");
  assert.equal(outcome.clientMessage, reason);
  assert.match(outcome.describe(), /the client said: elicitation mode is not supported/);
  peers.close();
});

test("a plain cancel is a dismissal, reported without a message", async () => {
  fresh();
  const peers = await connect(sidecar.baseUrl, () => Promise.resolve({ action: "cancel" }));
  assert.equal(await peers.prompt(), "end_turn");
  assert.deepEqual(sidecar.only().answers, [{ action: "cancel" }]);
  assert.equal(peers.outcomes[0]?.status, "cancelled");
  peers.close();
});

test("the wait survives the sidecar going away and coming back: one elicitation/complete", async () => {
  fresh();
  const peers = await connect(sidecar.baseUrl, () => Promise.resolve({ action: "accept" }));
  const turn = peers.prompt();
  await until(() => sidecar.elicitations.get("e1")?.status === "consented", "the accept is reported");
  await sidecar.kill(); // the long-poll breaks; the connector tries again with backoff
  await new Promise((resolve) => setTimeout(resolve, 300));
  await sidecar.start(); // the same port
  sidecar.complete("e1"); // the user finished at the provider
  assert.equal(await turn, "end_turn");
  assert.equal(peers.outcomes[0]?.status, "authorized");
  assert.deepEqual(
    peers.received.filter((m) => m.method === "elicitation/complete").map((m) => m.params),
    [{ elicitationId: "e1" }],
  );
  peers.close();
});

test("a sidecar that stays away past the expiry ends the wait with a sentence that names what happened", async () => {
  fresh();
  sidecar.ttlMs = 1500;
  const peers = await connect(sidecar.baseUrl, () => Promise.resolve({ action: "accept" }));
  const turn = peers.prompt().catch((error: unknown) => error);
  await until(() => sidecar.elicitations.get("e1")?.status === "consented", "the accept is reported");
  await sidecar.kill();
  await turn;
  const [error] = peers.errors;
  assert.ok(error instanceof SidecarUnavailableError);
  assert.match(error.message, /^The connector at http:\/\/127\.0\.0\.1:\d+ could not be reached since .* UTC \(/);
  assert.match(error.message, /the request for access expired at .* UTC: the authorization did not complete\./);
  assert.equal(peers.received.filter((m) => m.method === "elicitation/complete").length, 0);
  await sidecar.start();
  peers.close();
});

test("the elicitation ending before the client answers withdraws the create, then completes once", async () => {
  fresh();
  const peers = await connect(sidecar.baseUrl, () => new Promise(() => undefined)); // never answers
  const turn = peers.prompt();
  await until(() => peers.received.some((m) => m.method === "elicitation/create"), "the create arrives");
  sidecar.complete("e1");
  assert.equal(await turn, "end_turn");
  assert.deepEqual(
    peers.received.map((m) => m.method),
    ["elicitation/create", "$/cancel_request", "elicitation/complete"],
  );
  peers.close();
});

test("a client without URL mode is recorded at the sidecar and sent nothing", async () => {
  fresh();
  const peers = await connect(sidecar.baseUrl, () => Promise.resolve({ action: "accept" }), false);
  assert.equal(await peers.prompt(), "end_turn");
  assert.equal(peers.outcomes[0]?.status, "unsupported");
  assert.match(peers.outcomes[0].describe(), /URL-mode elicitation/);
  assert.deepEqual(peers.received, []);
  peers.close();
});

test("per-connection values, scopes and the account reach the sidecar as asked; none asked, none sent", async () => {
  fresh();
  const decline = (): Promise<{ action: "decline" }> => Promise.resolve({ action: "decline" });
  const asked = await connect(sidecar.baseUrl, decline, true, {
    scopes: ["repo"],
    connection: { subdomain: "acme" },
    account: "work",
  });
  await asked.prompt();
  asked.close();
  const sent = sidecar.created.splice(0);
  const plain = await connect(sidecar.baseUrl, decline);
  await plain.prompt();
  plain.close();
  assert.ok(sent.length > 0 && sidecar.created.length > 0);
  for (const body of sent) {
    assert.deepEqual([body.scopes, body.connection, body.account], [["repo"], { subdomain: "acme" }, "work"]);
  }
  for (const body of sidecar.created) {
    assert.deepEqual([body.scopes, body.connection, body.account], [undefined, undefined, undefined]);
  }
});
