// Unit tests for the error mapping and the retry rule, against the compiled dist/ (run
// `npm test`, which builds first). The bodies are the shape src/reply.rs renders.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as sdk from "../dist/index.js";

const body = (code, details = {}) => ({ error: { code, message: "m", details } });

const cases = [
  [403, "policy_denied", sdk.PolicyDenied],
  [403, "egress_denied", sdk.PolicyDenied],
  [403, "delegation_scope", sdk.PermissionDenied],
  [409, "idempotency_conflict", sdk.IdempotencyConflict],
  [409, "already_exists", sdk.Conflict],
  [422, "no_eligible_provider", sdk.NoEligibleProvider],
  [404, "not_found", sdk.NotFound],
  [429, "rate_limited", sdk.RateLimited],
  [503, "store_unavailable", sdk.Unavailable],
  [400, "invalid_request", sdk.InvalidRequest],
  [401, "unauthenticated", sdk.Unauthenticated],
  [410, "instance_lost", sdk.Gone],
  [502, "upstream_failed", sdk.UpstreamError],
  [504, "upstream_timeout", sdk.UpstreamError],
  [500, "internal", sdk.InternalError],
  [501, "unsupported", sdk.Unsupported],
  [418, "teapot", sdk.SandgateError],
];

for (const [status, code, cls] of cases) {
  test(`${status} ${code} -> ${cls.name}`, () => {
    const err = sdk.errorFromResponse(status, body(code), new Headers());
    assert.equal(err.constructor, cls);
    assert.ok(err instanceof sdk.SandgateError && err instanceof Error);
    assert.equal(err.code, code);
    assert.equal(err.status, status);
    assert.equal(err.name, cls.name);
  });
}

test("unknown code falls back to the status family", () => {
  const err = sdk.errorFromResponse(409, body("some_future_conflict"), new Headers());
  assert.equal(err.constructor, sdk.Conflict);
});

test("policy denial carries layer and string reasons", () => {
  const err = sdk.errorFromResponse(
    403,
    body("policy_denied", { layer: "creation", reasons: ["no gpu", 7] }),
    new Headers(),
  );
  assert.equal(err.layer, "creation");
  assert.deepEqual(err.reasons, ["no gpu"]);
});

test("a 403 naming a policy layer is a policy denial whatever its code", () => {
  const err = sdk.errorFromResponse(
    403,
    body("forbidden", { layer: "sandgate.creation", reasons: ["tier"] }),
    new Headers(),
  );
  assert.equal(err.constructor, sdk.PolicyDenied);
  assert.equal(err.layer, "sandgate.creation");
});

test("no eligible provider lists attempts", () => {
  const attempts = [
    { pool: "a", provider: "local", unmet_requirements: ["regions"] },
    "junk",
  ];
  const err = sdk.errorFromResponse(422, body("no_eligible_provider", { attempts }), new Headers());
  assert.deepEqual(err.attempts, [{ pool: "a", provider: "local", unmet_requirements: ["regions"] }]);
});

test("request id and Retry-After come from headers", () => {
  const h = new Headers({ "X-Request-Id": "req-1", "Retry-After": "3" });
  const err = sdk.errorFromResponse(429, body("rate_limited"), h);
  assert.equal(err.requestId, "req-1");
  assert.equal(err.retryAfter, 3);
});

for (const payload of [null, "text", [], { error: "x" }, { error: { code: 5 } }]) {
  test(`malformed body ${JSON.stringify(payload)} still gives an error`, () => {
    const err = sdk.errorFromResponse(503, payload, new Headers({ "X-Sandgate-Error": "overloaded" }));
    assert.equal(err.constructor, sdk.Unavailable);
    assert.equal(err.code, "overloaded");
    assert.equal(err.message, "overloaded: HTTP 503");
    assert.deepEqual(err.details, {});
  });
}

test("Retry-After parsing", () => {
  assert.equal(sdk.parseRetryAfter(null), undefined);
  assert.equal(sdk.parseRetryAfter(" 1.5 "), 1.5);
  assert.equal(sdk.parseRetryAfter("-1"), undefined);
  assert.equal(sdk.parseRetryAfter("Wed, 21 Oct 2026 07:28:00 GMT"), undefined);
  assert.equal(sdk.parseRetryAfter("99999"), 300);
});

const limited = (retryAfter) => new sdk.RateLimited("rate_limited", "m", { status: 429, retryAfter });

test("retries only replay-safe requests", () => {
  const p = new sdk.RetryPolicy();
  assert.equal(p.delay(1, "GET", limited(2)), 2);
  assert.equal(p.delay(1, "POST", limited(2)), undefined);
  assert.equal(p.delay(1, "POST", limited(2), "key"), 2);
});

test("never resends a create whose answer is its stored outcome", () => {
  const p = new sdk.RetryPolicy();
  const stored = new sdk.Unavailable("creation_failed", "m", {
    status: 503,
    retryAfter: 0,
    details: { sandbox_id: "sb-1", attempts: [] },
  });
  assert.equal(p.delay(1, "POST", stored, "key"), undefined);
  const transient = new sdk.Unavailable("overloaded", "m", { status: 503, retryAfter: 0 });
  assert.equal(p.delay(1, "POST", transient, "key"), 0);
});

test("retries only retryable families, with growing capped backoff", () => {
  const p = new sdk.RetryPolicy({ maxAttempts: 4, baseDelay: 1, maxDelay: 3 });
  const conflict = new sdk.Conflict("already_exists", "m", { status: 409 });
  assert.equal(p.delay(1, "GET", conflict), undefined);
  const waits = [1, 2, 3, 4].map((n) => p.delay(n, "GET", limited(), undefined, () => 1));
  assert.deepEqual(waits, [1, 2, 3, undefined]);
});
