import assert from "node:assert/strict";
import { test } from "node:test";

import { SidecarError, SidecarUnavailableError, untilExpiry } from "../src/index.js";

const backoff = { firstMs: 5, maxMs: 20 };

test("a network failure is tried again until it succeeds", async () => {
  let attempts = 0;
  const result = await untilExpiry(
    () => (++attempts < 4 ? Promise.reject(new TypeError("fetch failed")) : Promise.resolve("ok")),
    { expiresAt: new Date(Date.now() + 10_000), baseUrl: "http://sidecar", backoff },
  );
  assert.equal(result, "ok");
  assert.equal(attempts, 4);
});

test("an unavailable answer (503) is tried again; a refusal is not", async () => {
  let attempts = 0;
  const options = { expiresAt: new Date(Date.now() + 10_000), baseUrl: "http://sidecar", backoff };
  const value = await untilExpiry(
    () => (++attempts < 2 ? Promise.reject(new SidecarError(503, "http_503", "down")) : Promise.resolve(1)),
    options,
  );
  assert.equal(value, 1);
  attempts = 0;
  const refusal = new SidecarError(404, "unknown_elicitation", "No such elicitation.");
  await assert.rejects(
    untilExpiry(() => {
      attempts++;
      return Promise.reject(refusal);
    }, options),
    refusal,
  );
  assert.equal(attempts, 1);
});

test("past the expiry it fails with a typed error whose message a user can read", async () => {
  const expiresAt = new Date(Date.now() + 100);
  const refused = Object.assign(new TypeError("fetch failed"), { cause: { code: "ECONNREFUSED" } });
  const error = await untilExpiry(() => Promise.reject(refused), {
    expiresAt,
    baseUrl: "http://sidecar",
    backoff,
  }).catch((e: unknown) => e);
  assert.ok(error instanceof SidecarUnavailableError);
  assert.equal(error.code, "sidecar_unavailable");
  assert.match(error.message, /^The connector at http:\/\/sidecar could not be reached since \d\d:\d\d:\d\d UTC/);
  assert.match(error.message, /\(it refused the connection\)/);
  assert.ok(error.message.includes(`expired at ${expiresAt.toISOString().slice(11, 19)} UTC`));
});

test("the signal stops the retrying", async () => {
  const controller = new AbortController();
  const pending = untilExpiry(() => Promise.reject(new TypeError("fetch failed")), {
    expiresAt: new Date(Date.now() + 10_000),
    baseUrl: "http://sidecar",
    signal: controller.signal,
    backoff,
  });
  controller.abort("agent");
  await assert.rejects(pending, (reason) => reason === "agent");
});
