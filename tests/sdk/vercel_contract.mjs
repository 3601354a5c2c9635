// Drives the official @vercel/sandbox SDK against the fake Vercel Sandbox API
// (tests/it/common/fakes/vercel.rs); run by tests/it/vercel_fake.rs::official_js_sdk_accepts_the_fake.
//
// Environment: VERCEL_FAKE_URL (the fake's origin, which replaces https://vercel.com/api),
// VERCEL_TOKEN, VERCEL_TEAM_ID, VERCEL_PROJECT_ID, SANDGATE_SDK_NODE (the directory whose
// node_modules holds the SDK, default /opt/sandgate-sdk-node), VERCEL_SDK_EXPECTED_VERSION.
// The SDK has no base-URL setting: its APIClient always starts from https://vercel.com/api,
// so the script passes the SDK a `fetch` that rewrites that origin to the fake's.
// Prints `CONTRACT OK {json}` last on success; any failure throws (non-zero exit).

import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
import path from "node:path";
import assert from "node:assert/strict";

const sdkDir = process.env.SANDGATE_SDK_NODE || "/opt/sandgate-sdk-node";
const require = createRequire(path.join(sdkDir, "package.json"));
const entry = require.resolve("@vercel/sandbox");
const pkg = require("@vercel/sandbox/package.json");
const { Sandbox, APIError } = await import(pathToFileURL(entry).href);

const expected = process.env.VERCEL_SDK_EXPECTED_VERSION;
if (expected) assert.equal(pkg.version, expected, "the pinned @vercel/sandbox version");

const fake = process.env.VERCEL_FAKE_URL.replace(/\/$/, "");
const VERCEL = "https://vercel.com/api";
const seen = [];
// The SDK's own undici Agent is meant for its bundled undici; Node's fetch gets none.
const fakeFetch = (url, opts = {}) => {
  const target = String(url).replace(VERCEL, fake);
  assert.ok(target.startsWith(fake), `the SDK called ${url}`);
  seen.push(`${opts.method || "GET"} ${new URL(target).pathname}`);
  const { dispatcher: _dispatcher, ...rest } = opts;
  return globalThis.fetch(target, rest);
};
const credentials = {
  token: process.env.VERCEL_TOKEN,
  teamId: process.env.VERCEL_TEAM_ID,
  projectId: process.env.VERCEL_PROJECT_ID,
  fetch: fakeFetch,
};
const run = `run-${Date.now()}`;

// Wrong credentials: the SDK surfaces the fake's 401 as an APIError with Vercel's shape.
let unauthorized = null;
try {
  await Sandbox.create({ ...credentials, token: "not-the-token" });
} catch (e) {
  unauthorized = e;
}
assert.ok(unauthorized instanceof APIError, `expected an APIError, got ${unauthorized}`);
assert.equal(unauthorized.response.status, 401);
assert.equal(typeof unauthorized.json?.error?.code, "string");
assert.match(unauthorized.message, /401/);

const sandbox = await Sandbox.create({
  ...credentials,
  timeout: 120_000,
  resources: { vcpus: 2 },
  env: { CONTRACT_ENV: "from-create" },
  tags: { suite: "vercel-contract", run },
  networkPolicy: { allow: [], subnets: { allow: ["192.0.2.10/32"] } },
});
assert.equal(sandbox.status, "running");
assert.equal(sandbox.tags.suite, "vercel-contract");
assert.deepEqual(sandbox.networkPolicy, { allow: [], subnets: { allow: ["192.0.2.10/32"] } });

const echo = await sandbox.runCommand("sh", ["-c", 'echo "out:$CONTRACT_ENV"; echo err >&2']);
assert.equal(echo.exitCode, 0);
assert.equal(await echo.stdout(), "out:from-create\n");
assert.equal(await echo.stderr(), "err\n");

const failing = await sandbox.runCommand({
  cmd: "sh",
  args: ["-c", "exit 3"],
  env: { PER_COMMAND: "1" },
});
assert.equal(failing.exitCode, 3);

const pwd = await sandbox.runCommand("pwd");
assert.equal(pwd.exitCode, 0);
assert.match(await pwd.stdout(), /\/vercel\/sandbox\n$/);

await sandbox.writeFiles([
  { path: "hello.txt", content: Buffer.from("hello from the SDK\n") },
  { path: "/vercel/sandbox/nested/dir/data.bin", content: Buffer.from([0, 1, 2, 255]) },
]);
const hello = await sandbox.readFileToBuffer({ path: "hello.txt" });
assert.equal(hello.toString(), "hello from the SDK\n");
const data = await sandbox.readFileToBuffer({ path: "/vercel/sandbox/nested/dir/data.bin" });
assert.deepEqual([...data], [0, 1, 2, 255]);
assert.equal(await sandbox.readFileToBuffer({ path: "missing.txt" }), null);
const cat = await sandbox.runCommand("cat", ["hello.txt"]);
assert.equal(await cat.stdout(), "hello from the SDK\n");
await sandbox.mkDir("made");
const ls = await sandbox.runCommand("ls", ["-d", "made"]);
assert.equal(ls.exitCode, 0);

const listed = await Sandbox.list({ ...credentials, tags: { run } });
const names = listed.sandboxes.map((s) => s.name);
assert.deepEqual(names, [sandbox.name]);

const stopped = await sandbox.stop();
assert.equal(stopped.status, "stopped");
const again = await Sandbox.get({ ...credentials, name: sandbox.name });
assert.equal(again.status, "stopped");

await sandbox.delete();
let gone = null;
try {
  await Sandbox.get({ ...credentials, name: sandbox.name });
} catch (e) {
  gone = e;
}
assert.ok(gone instanceof APIError);
assert.equal(gone.response.status, 404);

console.log(
  "CONTRACT OK " +
    JSON.stringify({
      sdk: pkg.version,
      sandbox: sandbox.name,
      session: stopped.id,
      run,
      calls: seen,
    }),
);
