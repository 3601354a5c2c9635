// Drives the official e2b JS SDK against sandgate's E2B-compatible API (src/facade); run by
// tests/it/e2b_facade.rs. Environment: E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL (the
// facade's origin), SANDGATE_SDK_NODE (the directory whose node_modules holds the SDK,
// default /opt/sandgate-sdk-node), FACADE_SDK_VERSION (the e2b release expected).
// Prints `FACADE OK {json}` last on success; any failure throws (non-zero exit).

import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
import path from "node:path";
import assert from "node:assert/strict";

const sdkDir = process.env.SANDGATE_SDK_NODE || "/opt/sandgate-sdk-node";
const require = createRequire(path.join(sdkDir, "package.json"));
const pkg = require("e2b/package.json");
const { Sandbox, CommandExitError, NotFoundError, AuthenticationError } = await import(
  pathToFileURL(require.resolve("e2b")).href
);

const ok = (what) => console.log(`ok - ${what}`);
const expected = process.env.FACADE_SDK_VERSION;
if (expected) assert.equal(pkg.version, expected, "the pinned e2b version");
ok(`e2b ${pkg.version}`);

async function rejects(kind, fn, what) {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof kind, `${what}: ${e?.constructor?.name} ${e?.message}`);
    ok(`${what}: ${kind.name}`);
    return e;
  }
  throw new Error(`${what}: expected ${kind.name}`);
}

async function listed(metadata) {
  const paginator = Sandbox.list({ query: { metadata }, limit: 1 });
  const ids = [];
  while (paginator.hasNext) {
    for (const s of await paginator.nextItems()) ids.push(s.sandboxId);
  }
  return ids;
}

const run = Math.random().toString(16).slice(2, 14);
const sbx = await Sandbox.create({
  metadata: { suite: "facade-js", run },
  envs: { GREETING: "from-create" },
  timeoutMs: 120_000,
});
ok(`created ${sbx.sandboxId}`);
const info = await sbx.getInfo();
assert.equal(info.metadata.run, run);
assert.equal(info.state, "running");
ok("getInfo: running, metadata");

const hi = await sbx.commands.run("echo hi");
assert.equal(hi.stdout, "hi\n");
assert.equal(hi.exitCode, 0);
ok("commands.run('echo hi')");
const env = await sbx.commands.run('echo "$GREETING"');
assert.equal(env.stdout, "from-create\n");
ok("envVars reach the command");
const failed = await rejects(CommandExitError, () => sbx.commands.run("echo out; exit 3"), "a non-zero exit");
assert.equal(failed.exitCode, 3);
assert.equal(failed.stdout, "out\n");

const background = await sbx.commands.run("sleep 30", { background: true });
assert.ok(background.pid > 0);
assert.equal(await background.kill(), true);
const killed = await rejects(CommandExitError, () => background.wait(), "a killed command's wait");
assert.equal(killed.exitCode, -1);
ok(`killed: ${killed.error}`);

const text = "hello from the JS SDK\n";
const written = await sbx.files.write("/home/user/js.txt", text);
assert.equal(written.path, "/home/user/js.txt");
assert.equal(await sbx.files.read("/home/user/js.txt"), text);
const names = (await sbx.files.list("/home/user")).map((e) => e.name);
assert.ok(names.includes("js.txt"), `files.list: ${names}`);
ok("files.write / read / list");

const other = await Sandbox.create({ metadata: { suite: "facade-js", run: `other-${run}` }, timeoutMs: 60_000 });
assert.deepEqual(await listed({ run }), [sbx.sandboxId]);
ok("Sandbox.list by metadata");
assert.equal(await other.kill(), true);

await sbx.setTimeout(45_000);
const left = ((await sbx.getInfo()).endAt.getTime() - Date.now()) / 1000;
assert.ok(left > 35 && left <= 46, `setTimeout(45 s): ${left} s left`);
ok("setTimeout");

await rejects(AuthenticationError, () => Sandbox.list({ apiKey: `e2b_${"0".repeat(40)}` }).nextItems(), "a wrong API key");

assert.equal(await sbx.kill(), true);
assert.equal(await Sandbox.kill(sbx.sandboxId), false);
await rejects(NotFoundError, () => Sandbox.getInfo(sbx.sandboxId), "getInfo after kill");
console.log(`FACADE OK ${JSON.stringify({ sdk: pkg.version, sandbox: sbx.sandboxId, run })}`);
