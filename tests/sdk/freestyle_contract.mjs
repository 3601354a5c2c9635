// Drives the official freestyle-sandboxes SDK against the fake Freestyle API
// (tests/it/common/fakes/freestyle.rs); run by
// tests/it/freestyle_fake.rs::official_js_sdk_accepts_the_fake.
//
// Environment: FREESTYLE_API_URL (the fake's origin: the SDK's own setting for its base URL),
// FREESTYLE_API_KEY, SANDGATE_SDK_NODE (the directory whose node_modules holds the SDK,
// default /opt/sandgate-sdk-node), FREESTYLE_SDK_EXPECTED_VERSION.
// The script creates VMs the way sandgate's adapter does (tags, env and CA as additionalFiles,
// sticky persistence, no ports), then uses the SDK's own client for get, list, exec, files,
// suspend/start/stop, snapshot, create from the snapshot, fork and delete.
// Prints `CONTRACT OK {json}` last on success; any failure throws (non-zero exit).

import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
import path from "node:path";
import { readFileSync } from "node:fs";
import assert from "node:assert/strict";

const sdkDir = process.env.SANDGATE_SDK_NODE || "/opt/sandgate-sdk-node";
const require = createRequire(path.join(sdkDir, "package.json"));
const entry = require.resolve("freestyle-sandboxes");
// The package's "exports" do not include package.json: read it from the directory.
const pkg = JSON.parse(
  readFileSync(path.join(sdkDir, "node_modules/freestyle-sandboxes/package.json"), "utf8"),
);
const { Freestyle, Errors } = await import(pathToFileURL(entry).href);

const expected = process.env.FREESTYLE_SDK_EXPECTED_VERSION;
if (expected) assert.equal(pkg.version, expected, "the pinned freestyle-sandboxes version");

const run = `run-${Date.now()}`;
const seen = [];
const fetchLogged = (url, opts = {}) => {
  seen.push(`${opts.method || "GET"} ${new URL(String(url)).pathname}`);
  return globalThis.fetch(url, opts);
};

// Wrong credentials: the SDK surfaces the fake's 401 as its UnauthorizedError.
const wrong = new Freestyle({ apiKey: "not-the-key", fetch: fetchLogged });
await assert.rejects(wrong.vms.list(), (e) => e instanceof Errors.UnauthorizedError);

// FREESTYLE_API_URL and FREESTYLE_API_KEY come from the environment, as the SDK reads them.
const fs = new Freestyle({ fetch: fetchLogged });
const tags = { sandgate_sandbox: "sb-contract", sandgate_attempt: `sb-contract-${run}` };
const created = await fs.vms.create({
  additionalFiles: {
    "/etc/sandgate/tags.json": { content: JSON.stringify(tags), encoding: "utf-8" },
    "/etc/sandgate/env.sh": { content: "export CONTRACT_ENV=from-create\n", encoding: "utf-8" },
  },
  persistence: { type: "sticky" },
  ports: [],
  idleTimeoutSeconds: 600,
  waitForReadySignal: true,
});
const vm = created.vm;
assert.equal(typeof created.vmId, "string");
assert.equal(created.vmId.length, 20);
assert.deepEqual(created.domains, [], "the SDK filters the built-in *.vm.freestyle.sh domain");
const info = await vm.getInfo();
assert.equal(info.state, "running");

const listed = await fs.vms.list();
assert.ok(listed.vms.some((v) => v.id === vm.vmId && v.state === "running"));
assert.equal(listed.totalCount, listed.vms.length);

// Exec: one shell line, the environment file sourced as the adapter does.
const echo = await vm.exec(". /etc/sandgate/env.sh; echo \"out:$CONTRACT_ENV\"; echo err >&2");
assert.equal(echo.statusCode, 0);
assert.equal(echo.stdout, "out:from-create\n");
assert.equal(echo.stderr, "err\n");
const failing = await vm.exec({ command: "exit 3", timeoutMs: 10_000 });
assert.equal(failing.statusCode, 3);

// Files: the tag file written by the create, then text and bytes, a directory, mkdir/remove
// (the SDK runs those through exec).
const tagFile = JSON.parse(await vm.fs.readTextFile("/etc/sandgate/tags.json"));
assert.deepEqual(tagFile, tags);
await vm.fs.writeTextFile("/root/hello.txt", "hello from the SDK\n");
assert.equal(await vm.fs.readTextFile("/root/hello.txt"), "hello from the SDK\n");
await vm.fs.writeFile("/root/blob.bin", Buffer.from([0, 1, 2, 255]));
assert.deepEqual([...(await vm.fs.readFile("/root/blob.bin"))], [0, 1, 2, 255]);
await vm.fs.mkdir("/root/made/deep", true);
assert.equal(await vm.fs.exists("/root/made/deep"), true);
const dir = await vm.fs.readDir("/root");
assert.deepEqual(
  dir.map((f) => `${f.name}:${f.kind}`),
  ["blob.bin:file", "hello.txt:file", "made:directory"],
);
await vm.fs.remove("/root/made", true);
assert.equal(await vm.fs.exists("/root/made"), false);
await assert.rejects(vm.fs.readFile("/root/missing.txt"), (e) => e instanceof Errors.FileNotFoundError);

// Lifecycle: suspend → suspended, start → running, the files kept.
await vm.suspend();
let state = (await vm.getInfo()).state;
assert.ok(["suspending", "suspended"].includes(state), state);
for (let i = 0; i < 100 && state !== "suspended"; i++) {
  await new Promise((r) => setTimeout(r, 50));
  state = (await vm.getInfo()).state;
}
assert.equal(state, "suspended");
await assert.rejects(vm.exec("true"), (e) => e instanceof Errors.VmNotRunningError);
await vm.start();
assert.equal((await vm.getInfo()).state, "running");
assert.equal(await vm.fs.readTextFile("/root/hello.txt"), "hello from the SDK\n");

// Snapshot, and a VM from it; fork.
const snap = await vm.snapshot({ name: "contract" });
assert.match(snap.snapshotId, /^sc-[a-z0-9]{20}$/);
assert.equal(snap.sourceVmId, vm.vmId);
const restored = await fs.vms.create({ snapshotId: snap.snapshotId, waitForReadySignal: true });
assert.equal(await restored.vm.fs.readTextFile("/root/hello.txt"), "hello from the SDK\n");
const forked = await vm.fork({ count: 1 });
assert.equal(forked.forks.length, 1);
const fork = forked.forks[0].vm;
assert.equal((await fork.exec("cat /root/hello.txt")).stdout, "hello from the SDK\n");
await assert.rejects(
  fs.vms.create({ snapshotId: "sc-00000000000000000000" }),
  (e) => e instanceof Errors.SnapshotNotFoundError,
);

// Stop, then delete everything; a deleted VM is not found.
await vm.stop();
assert.equal((await vm.getInfo()).state, "stopped");
for (const v of [vm, restored.vm, fork]) await v.delete();
await assert.rejects(vm.getInfo(), (e) => e instanceof Errors.VmNotFoundError);
await fs.vms.snapshots.delete({ snapshotId: snap.snapshotId });
const after = await fs.vms.list();
assert.ok(!after.vms.some((v) => v.id === vm.vmId));

console.log(
  "CONTRACT OK " +
    JSON.stringify({
      sdk: pkg.version,
      vm: vm.vmId,
      restored: restored.vmId,
      fork: forked.forks[0].vmId,
      snapshot: snap.snapshotId,
      run,
      calls: seen,
    }),
);
