// Drives the official @codesandbox/sdk against the fake CodeSandbox API
// (tests/it/common/fakes/codesandbox.rs); run by
// tests/it/codesandbox_fake.rs::official_js_sdk_accepts_the_fake.
//
// Environment: CSB_FAKE_URL (the fake's origin, given to the SDK as `baseUrl`), CSB_API_KEY,
// SANDGATE_SDK_NODE (the directory whose node_modules holds the SDK, default
// /opt/sandgate-sdk-node), CSB_SDK_EXPECTED_VERSION.
// Only the control plane is driven: `sandbox.connect()` (commands, files) speaks the VM's
// agent at the `pitcher_url` a start answers, which neither the fake nor sandgate's adapter
// implements.
// Prints `CONTRACT OK {json}` last on success; any failure throws (non-zero exit).

import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import path from "node:path";
import assert from "node:assert/strict";

const sdkDir = process.env.SANDGATE_SDK_NODE || "/opt/sandgate-sdk-node";
// The package exports no ./package.json: read it from its directory, and import its
// "import" entry (the ESM build).
const pkgDir = path.join(sdkDir, "node_modules/@codesandbox/sdk");
const pkg = JSON.parse(readFileSync(path.join(pkgDir, "package.json"), "utf8"));
const entry = path.join(pkgDir, pkg.exports["."].import);
const { CodeSandbox, VMTier } = await import(pathToFileURL(entry).href);

const expected = process.env.CSB_SDK_EXPECTED_VERSION;
if (expected) assert.equal(pkg.version, expected, "the pinned @codesandbox/sdk version");

const fake = process.env.CSB_FAKE_URL.replace(/\/$/, "");
const seen = [];
const fakeFetch = (request) => {
  assert.ok(request.url.startsWith(fake), `the SDK called ${request.url}`);
  seen.push(`${request.method} ${new URL(request.url).pathname}`);
  return globalThis.fetch(request);
};
const opts = { baseUrl: fake, fetch: fakeFetch };
const sdk = new CodeSandbox(process.env.CSB_API_KEY, opts);
const run = `run-${Date.now()}`;

// Wrong key: the SDK's handleResponse shows the fake's first error.
const stranger = new CodeSandbox("csb_not_the_key", opts);
await assert.rejects(() => stranger.sandboxes.list(), /Failed to list sandboxes: Unauthorized/);

// A scripted 429 (the Rust test scripts `rate_limit` first): the SDK's RateLimitError reads
// CodeSandbox's x-csb-rate-hourly-* headers.
await assert.rejects(
  () => sdk.sandboxes.create({ tags: ["refused"] }),
  (e) => e.type === "rate-limit" && /0 of 1000 requests remaining/.test(e.message),
);

// Create: fork of the default template, then the VM start, with tags and start options.
const sandbox = await sdk.sandboxes.create({
  title: "contract",
  tags: ["suite=codesandbox-contract", `run=${run}`],
  privacy: "private",
  vmTier: VMTier.Nano,
  hibernationTimeoutSeconds: 120,
});
assert.equal(sandbox.bootupType, "FORK");
assert.equal(sandbox.cluster, "fake-cluster");
assert.equal(typeof sandbox.id, "string");

const info = await sdk.sandboxes.get(sandbox.id);
assert.equal(info.id, sandbox.id);
assert.equal(info.title, "contract");
assert.equal(info.privacy, "private");
assert.ok(info.createdAt instanceof Date && !Number.isNaN(info.createdAt.getTime()));
assert.deepEqual([...info.tags].sort(), ["run=" + run, "sdk", "suite=codesandbox-contract"].sort());

const listed = await sdk.sandboxes.list({ tags: [`run=${run}`] });
assert.deepEqual(listed.sandboxes.map((s) => s.id), [sandbox.id]);
assert.equal(listed.totalCount, 1);
const running = await sdk.sandboxes.list({ tags: [`run=${run}`], status: "running" });
assert.equal(running.sandboxes.length, 1);
const vms = await sdk.sandboxes.listRunning();
assert.ok(vms.vms.some((vm) => vm.id === sandbox.id));

// Lifecycle: hibernate then resume, shut down then restart (a clean boot).
await sdk.sandboxes.hibernate(sandbox.id);
const idle = await sdk.sandboxes.list({ tags: [`run=${run}`], status: "running" });
assert.equal(idle.sandboxes.length, 0);
const resumed = await sdk.sandboxes.resume(sandbox.id);
assert.equal(resumed.bootupType, "RESUME");
await sdk.sandboxes.shutdown(sandbox.id);
const restarted = await sdk.sandboxes.restart(sandbox.id);
assert.equal(restarted.bootupType, "CLEAN");
const again = await sdk.sandboxes.resume(sandbox.id);
assert.equal(again.bootupType, "RUNNING");

// Fork: a new sandbox from this one (the SDK's deprecated `fork` is `create({id})`).
const forked = await sdk.sandboxes.fork(sandbox.id, { hibernationTimeoutSeconds: 60 });
assert.notEqual(forked.id, sandbox.id);
assert.equal(forked.bootupType, "FORK");

// Pagination: the SDK walks pages of one up to its limit, and says where the next starts.
const all = await sdk.sandboxes.list({ pagination: { page: 1, pageSize: 1 }, tags: ["sdk"] });
assert.equal(all.sandboxes.length, 2);
const page1 = await sdk.sandboxes.list({
  limit: 1,
  pagination: { page: 1, pageSize: 1 },
  tags: ["sdk"],
});
assert.equal(page1.sandboxes.length, 1);
assert.equal(page1.pagination.nextPage, 2);

// Delete both; a deleted sandbox is not found.
await sdk.sandboxes.delete(forked.id);
await sdk.sandboxes.delete(sandbox.id);
await assert.rejects(() => sdk.sandboxes.get(sandbox.id), /Sandbox not found/);
await assert.rejects(() => sdk.sandboxes.resume(sandbox.id), /Sandbox not found/);
const after = await sdk.sandboxes.list({ tags: [`run=${run}`] });
assert.equal(after.sandboxes.length, 0);

console.log(
  "CONTRACT OK " +
    JSON.stringify({
      sdk: pkg.version,
      sandbox: sandbox.id,
      forked: forked.id,
      run,
      calls: seen,
    }),
);
