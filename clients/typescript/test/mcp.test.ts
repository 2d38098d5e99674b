// The MCP side of the package against a sidecar in memory, with a peer standing in for an MCP SDK's connection:
// what the client is sent (elicitation/create, the completion, the -32042 data) and what the sidecar is told.
// tests/test_mcp_ts_example.py runs it with the official MCP TypeScript SDK against a real sidecar.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import {
  AuthorizationCancelled,
  AuthorizationOutcome,
  ELICITATION_COMPLETE,
  INPUT_REQUEST_KEY,
  McpConnector,
  URL_ELICITATION_REQUIRED,
  UrlElicitationRequired,
  urlModeAdvertised,
  type CompletionNotification,
  type InputRequired,
  type McpPeer,
  type UrlElicitation,
} from "../src/mcp.js";
import { FakeSidecar } from "./fake-sidecar.js";
import { until } from "./peers.js";

const sidecar = new FakeSidecar();
before(() => sidecar.start());
after(() => sidecar.kill());

const user = { issuer: "local", subject: "alice" };

type Recorded = McpPeer & {
  asked: UrlElicitation[];
  told: Array<{ notification: CompletionNotification; duringCall: boolean }>;
};

function peer(capabilities: { elicitation?: unknown }, answer: (params: UrlElicitation) => Promise<unknown>): Recorded {
  const asked: UrlElicitation[] = [];
  const told: Recorded["told"] = [];
  return {
    connectionId: "mcp-test-connection",
    asked,
    told,
    capabilities: () => capabilities,
    elicit: async (params) => {
      asked.push(params);
      return (await answer(params)) as Record<string, unknown>;
    },
    notify: (notification, duringCall) => {
      told.push({ notification, duringCall });
      return Promise.resolve();
    },
  };
}

function fresh(): McpConnector {
  sidecar.elicitations.clear();
  sidecar.created.length = 0;
  return new McpConnector({ baseUrl: sidecar.baseUrl, apiKey: "acpk_test", backoff: { firstMs: 20, maxMs: 100 } });
}

test("URL mode is an explicit url object only: MCP's empty elicitation object means form only", () => {
  const table: Array<[{ elicitation?: unknown } | undefined, boolean]> = [
    [undefined, false],
    [{}, false],
    [{ elicitation: null }, false],
    [{ elicitation: {} }, false], // MCP: form only (ACP would read no mode at all; neither has URL mode)
    [{ elicitation: { form: {} } }, false],
    [{ elicitation: { url: null } }, false],
    [{ elicitation: { url: [] } }, false],
    [{ elicitation: { url: true } }, false],
    [{ elicitation: [] }, false],
    [{ elicitation: { url: {} } }, true],
    [{ elicitation: { form: {}, url: {} } }, true],
  ];
  for (const [capabilities, expected] of table) {
    assert.equal(urlModeAdvertised(capabilities), expected, JSON.stringify(capabilities));
  }
});

test("asked on the call, accepted, completed in the browser: one completion on the call's stream", async () => {
  const connector = fresh();
  const client = peer({ elicitation: { url: {} } }, () => Promise.resolve({ action: "accept" }));
  const outcome = connector.requestAuthorization(client, { user, provider: "demo", requestId: 7 });
  await until(() => sidecar.elicitations.get("e1")?.answers.length === 1, "the answer is reported");
  sidecar.complete("e1");
  const done = await outcome;
  assert.equal(done.status, "authorized");
  assert.deepEqual(client.asked, [
    { mode: "url", message: "Sign in to Demo", url: `${sidecar.baseUrl}/connect/e1`, elicitationId: "e1" },
  ]);
  assert.deepEqual(client.told, [
    { notification: { method: ELICITATION_COMPLETE, params: { elicitationId: "e1" } }, duringCall: true },
  ]);
  const created = sidecar.created.at(-1);
  assert.deepEqual(created?.scope, { requestId: 7 });
  assert.equal(created.connectionId, "mcp-test-connection");
});

test("decline and cancel end it at once, without a completion", async () => {
  for (const [action, status] of [
    ["decline", "declined"],
    ["cancel", "cancelled"],
  ] as const) {
    const connector = fresh();
    const client = peer({ elicitation: { url: {} } }, () => Promise.resolve({ action }));
    const outcome = await connector.requestAuthorization(client, { user, provider: "demo", requestId: 1 });
    assert.equal(outcome.status, status);
    assert.deepEqual(sidecar.only().answers, [{ action }]);
    assert.deepEqual(client.told, []);
  }
});

test("a client without URL mode is not asked: unsupported, recorded at the sidecar", async () => {
  const connector = fresh();
  const client = peer({ elicitation: {} }, () => Promise.reject(new Error("must not be asked")));
  const outcome = await connector.requestAuthorization(client, { user, provider: "demo", requestId: 1 });
  assert.equal(outcome.status, "unsupported");
  assert.deepEqual(client.asked, []);
  assert.deepEqual(
    sidecar.created.map((body) => [body.grantsOnly, body.urlMode]),
    [
      [true, undefined],
      [undefined, false],
    ],
  );
  assert.equal(sidecar.elicitations.size, 0);
});

test("-32042: the error carries the elicitation; the completion goes out on the connection once it ends", async () => {
  const connector = fresh();
  const client = peer({ elicitation: { url: {} } }, () => Promise.reject(new Error("must not be asked")));
  const thrown = await connector.requireAuthorization(client, { user, provider: "demo", requestId: 3 }).then(
    () => undefined,
    (error: unknown) => error,
  );
  assert.ok(thrown instanceof UrlElicitationRequired);
  assert.equal(thrown.code, URL_ELICITATION_REQUIRED);
  assert.deepEqual(thrown.data, {
    elicitations: [
      { mode: "url", message: "Sign in to Demo", url: `${sidecar.baseUrl}/connect/e1`, elicitationId: "e1" },
    ],
  });
  assert.deepEqual(client.asked, []);
  sidecar.complete("e1");
  await until(() => client.told.length === 1, "the completion is told");
  assert.deepEqual(client.told, [
    { notification: { method: ELICITATION_COMPLETE, params: { elicitationId: "e1" } }, duringCall: false },
  ]);
  connector.close();
});

test("a tool call cancelled while the browser is open ends the elicitation with its cause, without a completion", async () => {
  const connector = fresh();
  const call = new AbortController();
  const client = peer({ elicitation: { url: {} } }, () => Promise.resolve({ action: "accept" }));
  const outcome = connector.requestAuthorization(client, { user, provider: "demo", requestId: 9, signal: call.signal });
  await until(() => sidecar.elicitations.get("e1")?.answers.length === 1, "the answer is reported");
  call.abort();
  await assert.rejects(outcome, (error: unknown) => error instanceof AuthorizationCancelled);
  assert.deepEqual(sidecar.only().cancels, [{ cause: "client_cancel_request" }]);
  assert.deepEqual(client.told, []);
});

test(
  "2026-07-28: the first call answers input_required, the retry's accept waits for the browser",
  { timeout: 20_000 },
  async () => {
    const connector = fresh();
    const client = peer({ elicitation: { url: {} } }, () => Promise.reject(new Error("no requests at 2026-07-28")));
    const first = await connector.round(client, { user, provider: "demo", requestId: 1 }, {});
    assert.ok(!(first instanceof AuthorizationOutcome));
    assert.deepEqual(first.inputRequests, {
      [INPUT_REQUEST_KEY]: {
        method: "elicitation/create",
        params: { mode: "url", message: "Sign in to Demo", url: `${sidecar.baseUrl}/connect/e1` },
      },
    });
    assert.ok(first.requestState.length >= 40);
    assert.match(String(sidecar.created.at(-1)?.connectionId), /^mcp-round-/);
    // Retried without an answer: the same question.
    const again = await connector.round(
      client,
      { user, provider: "demo", requestId: 2 },
      { requestState: first.requestState },
    );
    assert.deepEqual(again, first);
    const retry = connector.round(
      client,
      { user, provider: "demo", requestId: 3 },
      { requestState: first.requestState, inputResponses: { [INPUT_REQUEST_KEY]: { action: "accept" } } },
    );
    await until(() => sidecar.elicitations.get("e1")?.answers.length === 1, "the answer is reported");
    sidecar.complete("e1");
    const outcome = await retry;
    assert.ok(outcome instanceof AuthorizationOutcome);
    assert.equal(outcome.status, "authorized");
    assert.deepEqual(client.asked, []);
    assert.deepEqual(client.told, []); // no completion notification exists at 2026-07-28
    // The round is over: its token starts a new one.
    const fresher = (await connector.round(
      client,
      { user, provider: "demo", requestId: 4 },
      { requestState: first.requestState, inputResponses: { [INPUT_REQUEST_KEY]: { action: "accept" } } },
    )) as InputRequired;
    assert.notEqual(fresher.requestState, first.requestState);
    assert.equal(sidecar.elicitations.size, 2);
    connector.close();
  },
);

test(
  "2026-07-28: decline ends the round; another user's echo of the token starts over; no URL mode: unsupported",
  { timeout: 20_000 },
  async () => {
    const connector = fresh();
    const client = peer({ elicitation: { url: {} } }, () => Promise.reject(new Error("no requests at 2026-07-28")));
    const first = (await connector.round(client, { user, provider: "demo", requestId: 1 }, {})) as InputRequired;
    const bob = { issuer: "local", subject: "bob" };
    const taken = (await connector.round(
      client,
      { user: bob, provider: "demo", requestId: 2 },
      { requestState: first.requestState, inputResponses: { [INPUT_REQUEST_KEY]: { action: "accept" } } },
    )) as InputRequired;
    assert.notEqual(taken.requestState, first.requestState);
    assert.deepEqual(sidecar.elicitations.get("e1")?.answers, []);
    const declined = await connector.round(
      client,
      { user, provider: "demo", requestId: 3 },
      { requestState: first.requestState, inputResponses: { [INPUT_REQUEST_KEY]: { action: "decline" } } },
    );
    assert.ok(declined instanceof AuthorizationOutcome);
    assert.equal(declined.status, "declined");
    const formOnly = peer({ elicitation: {} }, () => Promise.reject(new Error("must not be asked")));
    const unsupported = await connector.round(formOnly, { user, provider: "demo", requestId: 4 }, {});
    assert.ok(unsupported instanceof AuthorizationOutcome);
    assert.equal(unsupported.status, "unsupported");
    connector.close();
  },
);
