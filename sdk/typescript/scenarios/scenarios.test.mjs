// The TypeScript SDK against a real gateway (run by tests/it/sdk_typescript.rs, which starts
// it and compiles dist/: see tests/it/common/own_sdk.rs for its pools, policies and origin).
// The same scenarios as sdk/python/scenarios/test_scenarios.py.
//
// Environment: SANDGATE_URL, SANDGATE_TOKEN (alice, workspace ws-a), SANDGATE_TOKEN_B (bob,
// ws-b), SANDGATE_WORKSPACE, SANDGATE_ORIGIN_PORT (the HTTPS origin behind api.allowed.test
// and api.other.test), SANDGATE_FAKE_DAYTONA (the fake Daytona behind the pool `daytona`),
// SANDGATE_STORE_PATH (the gateway's SQLite database), SANDGATE_SNAPSHOT_DIR (the local
// provider's snapshots), SANDGATE_CA (the gateway's CA certificate), SANDGATE_PORTS_ADDR (its
// ports listener).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash, randomBytes, randomUUID } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { request as httpsRequest } from "node:https";
import { inspect } from "node:util";
import * as sdk from "../dist/index.js";

const { Client, RetryPolicy } = sdk;
const PORT = Number(process.env.SANDGATE_ORIGIN_PORT);
const SECRET = `sk_sdk_ts_scenario_${randomUUID()}`;
const FAILOVER = {
  labels: { suite: "typescript" },
  network: { allow_domains: ["api.allowed.test"] },
  routing: { priorities: ["price"] },
};
const LOCAL = { provider: "local", labels: { suite: "typescript" } };

const client = new Client({ workspace: process.env.SANDGATE_WORKSPACE });
let sandbox;

before(async () => {
  sandbox = await client.sandboxes.create(LOCAL);
});
after(async () => {
  await sandbox?.delete();
});

/** The error `fn` rejects with, checked to be an instance of `cls`. */
async function raises(cls, fn) {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof cls, `expected ${cls.name}, got ${e?.constructor?.name}: ${e}`);
    return e;
  }
  assert.fail(`expected ${cls.name}, nothing was thrown`);
}

test("create with routing and network follows a failover that advances twice", async () => {
  const seen = [];
  const key = `ts-failover-${randomUUID()}`;
  const resumed = [];
  const watched = new Client({
    fetch: (url, init) => {
      resumed.push(init?.headers?.["last-event-id"]);
      return fetch(url, init);
    },
  });
  const sb = await watched.sandboxes.create(FAILOVER, { idempotencyKey: key, onEvent: (e) => seen.push(e) });
  assert.equal(sb.state, "running");
  assert.equal(sb.info.placement.pool, "local");
  assert.ok(sb.egressToken, "the first create's answer carries the egress token");
  assert.ok(!inspect(sb, { depth: 5 }).includes(sb.egressToken));
  assert.ok(!JSON.stringify(sb).includes(sb.egressToken));
  const events = seen;
  const ended = events.filter((e) => e.type === "attempt_ended").map((e) => [e.data.pool, e.data.outcome]);
  assert.deepEqual(ended, [
    ["sim-slow", "advance"],
    ["sim-full", "advance"],
    ["local", "success"],
  ]);
  assert.deepEqual(
    events.filter((e) => e.type === "attempt_started").map((e) => e.data.pool),
    ["sim-slow", "sim-full", "local"],
  );
  assert.equal(events.at(-1).type, "done");
  assert.equal(events.at(-1).data.state, "running");
  // The gateway ends each stream after a second and the create took longer: the client
  // came back with Last-Event-ID, and no event was lost or repeated.
  assert.ok(resumed.some(Boolean), JSON.stringify(resumed));
  const ids = events.map((e) => Number(e.id));
  assert.deepEqual(ids, [...new Set(ids)].sort((a, b) => a - b));
  // Followed live, not replayed: the stream began while the create was still placing (a
  // stream opened after the end replays the attempts first).
  assert.equal(events[0].type, "state");
  assert.ok(["pending", "provisioning"].includes(events[0].data.state), JSON.stringify(events[0]));
  assert.deepEqual(sb.info.attempts.map((a) => a.pool), ["sim-slow", "sim-full", "local"]);
  // Network: the sandbox reaches the allowed origin through the proxy, not another.
  const ok = await sb.exec(`curl -s -o /dev/null -w '%{http_code}' https://api.allowed.test:${PORT}/net`);
  assert.equal(ok.stdout, "200");
  const denied = await sb.exec(`curl -s -o /dev/null -w '%{http_code}' https://api.other.test:${PORT}/net`);
  assert.notEqual(denied.stdout, "200");

  // A stream opened after the create ended replays the record; Last-Event-ID after its
  // second event gives exactly the rest.
  const all = [];
  for await (const e of client.sandboxes.events(sb.id)) all.push(e);
  const attempts = (evs) => evs.filter((e) => e.type.startsWith("attempt_")).map((e) => [e.type, e.data.pool]);
  assert.deepEqual(attempts(all), attempts(events));
  assert.deepEqual(all.slice(-2).map((e) => e.type), ["state", "done"]);
  const rest = [];
  for await (const e of client.sandboxes.events(sb.id, { lastEventId: all[1].id })) rest.push(e);
  assert.deepEqual(rest.map((e) => [e.type, e.id]), all.slice(2).map((e) => [e.type, e.id]));

  // Idempotent replay: the same sandbox, without the token; another body conflicts.
  const again = await client.sandboxes.create(FAILOVER, { idempotencyKey: key });
  assert.equal(again.id, sb.id);
  assert.equal(again.egressToken, undefined);
  const conflict = await raises(sdk.IdempotencyConflict, () =>
    client.sandboxes.create({ ...FAILOVER, labels: { suite: "other" } }, { idempotencyKey: key }),
  );
  assert.equal(conflict.status, 409);
  assert.ok(conflict.requestId);

  // Explain matches what the server recorded when it accepted the create.
  const explained = await client.routes.explain(FAILOVER);
  assert.deepEqual(explained.order, sb.info.raw.placement_record.explanation.order);
  assert.deepEqual(explained.order, ["sim-slow", "sim-full", "local", "sim-ok"]);
  await sb.delete();
  // A replay after the delete is the same sandbox, deleted (not a new one, not an error).
  const replayed = await client.sandboxes.create(FAILOVER, { idempotencyKey: key });
  assert.deepEqual([replayed.id, replayed.state], [sb.id, "deleted"]);
});

test("exec streams in order with exit codes", async () => {
  const result = await sandbox.exec("echo a; echo b >&2; echo c; exit 3");
  assert.deepEqual([result.exitCode, result.reason], [3, "exited"]);
  assert.deepEqual([result.stdout, result.stderr], ["a\nc\n", "b\n"]);
  assert.equal((await sandbox.exec(["true"])).exitCode, 0);
  assert.equal((await sandbox.exec(["false"])).exitCode, 1);
  const env = await sandbox.exec("echo $GREETING; pwd", { env: { GREETING: "hi" }, cwd: "/tmp" });
  assert.equal(env.stdout, "hi\n/tmp\n");

  const stream = await sandbox.exec(
    "for i in 1 2 3; do echo out$i; sleep 0.3; echo err$i >&2; sleep 0.3; done",
    { stream: true },
  );
  const events = [];
  const decoder = new TextDecoder();
  for await (const e of stream) {
    if (e.type === "stdout" || e.type === "stderr") events.push([e.type, decoder.decode(e.data)]);
  }
  assert.deepEqual(events, [
    ["stdout", "out1\n"], ["stderr", "err1\n"],
    ["stdout", "out2\n"], ["stderr", "err2\n"],
    ["stdout", "out3\n"], ["stderr", "err3\n"],
  ]);
  assert.equal(stream.result.exitCode, 0);
  assert.ok(stream.execId);

  // Output arrives while the command runs, not at its end.
  const arrivals = [];
  const begun = Date.now();
  await sandbox.exec("echo first; sleep 1; echo second", { onStdout: () => arrivals.push(Date.now() - begun) });
  assert.equal(arrivals.length, 2);
  assert.ok(arrivals[1] - arrivals[0] > 700, `${arrivals}`);

  const timed = await sandbox.exec(["sleep", "10"], { timeout: 0.5 });
  assert.equal(timed.reason, "timed_out");

  // Output that is not UTF-8 arrives as the bytes it was.
  const raw = await sandbox.exec("printf '\\377\\376ok'");
  assert.deepEqual([...raw.stdoutBytes], [0xff, 0xfe, 0x6f, 0x6b]);

  // Cancelling kills the command; its stream ends with reason `cancelled`.
  const running = await sandbox.exec(["sleep", "30"], { stream: true });
  for await (const e of running) if (e.type === "started") await running.cancel();
  assert.equal(running.result.reason, "cancelled");
});

/** GET `path` of a sandbox port by the listener's address, with the port's name as TLS server name and Host. */
function portGet(access, path, headers) {
  const [ip, port] = process.env.SANDGATE_PORTS_ADDR.split(":");
  const name = access.host.split(":")[0];
  const ca = readFileSync(process.env.SANDGATE_CA);
  return new Promise((resolve, reject) => {
    const req = httpsRequest(
      { host: ip, port: Number(port), path, servername: name, ca, headers: { host: access.host, ...headers } },
      (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (d) => (body += d));
        res.on("end", () => resolve([res.statusCode, body]));
      },
    );
    req.on("error", reject);
    req.end();
  });
}

test("a port is reached through the gateway", async () => {
  await sandbox.exec(
    "mkdir -p /tmp/site-ts && echo port-ok > /tmp/site-ts/k && cd /tmp/site-ts && " +
      "nohup python3 -m http.server 8003 --bind 127.0.0.1 >/dev/null 2>&1 &",
  );
  const access = await sandbox.port(8003);
  assert.equal(access.url, `https://${access.host}`);
  assert.equal(access.public, false);
  const token = { [access.token_header]: access.token };
  const deadline = Date.now() + 30000;
  let answer = await portGet(access, "/k", token);
  while (answer[0] === 502 && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 200));
    answer = await portGet(access, "/k", token);
  }
  assert.deepEqual(answer, [200, "port-ok\n"]);
  assert.equal((await portGet(access, "/k", {}))[0], 401);
  await raises(sdk.InvalidRequest, () => sandbox.port(0));
});

test("files round trip including a 5 MiB binary", async () => {
  await sandbox.files.mkdir("/home/user/sdk/deep", { parents: true });
  const blob = new Uint8Array(randomBytes(5 * 1024 * 1024));
  await sandbox.files.write("/home/user/sdk/deep/blob.bin", blob);
  await sandbox.files.write("/home/user/sdk/hello.txt", "hello");
  assert.deepEqual(await sandbox.files.read("/home/user/sdk/deep/blob.bin"), blob);
  assert.equal(await sandbox.files.readText("/home/user/sdk/hello.txt"), "hello");
  const entries = Object.fromEntries((await sandbox.files.list("/home/user/sdk")).map((e) => [e.name, e]));
  assert.equal(entries["hello.txt"].size, 5);
  assert.ok(entries["deep"].kind.startsWith("dir"));
  assert.deepEqual((await sandbox.files.list("/home/user/sdk/deep")).map((e) => e.size), [blob.length]);
  const sum = await sandbox.exec("sha256sum /home/user/sdk/deep/blob.bin | cut -d' ' -f1");
  assert.equal(sum.stdout.trim(), createHash("sha256").update(blob).digest("hex"));
  await sandbox.files.remove("/home/user/sdk/hello.txt");
  assert.ok(!(await sandbox.files.list("/home/user/sdk")).some((e) => e.name === "hello.txt"));
  await sandbox.files.remove("/home/user/sdk", { recursive: true });
  await raises(sdk.NotFound, () => sandbox.files.read("/home/user/sdk/deep/blob.bin"));
});

test("lifecycle", async () => {
  const sb = await client.sandboxes.create(LOCAL);
  await sb.files.write("/home/user/keep.txt", "kept");
  assert.equal((await sb.pause()).state, "paused");
  assert.equal((await sb.resume()).state, "running");
  const now = Date.now();
  await sb.setLifetime(3600);
  assert.ok(sb.info.expires_ms >= now + 3590_000 && sb.info.expires_ms <= now + 3610_000);
  assert.equal((await sb.stop()).state, "stopped");
  const stopped = await raises(sdk.Conflict, () => sb.exec("true"));
  assert.equal(stopped.code, "sandbox_state");
  assert.equal((await sb.start()).state, "running");
  assert.equal((await sb.exec("cat /home/user/keep.txt")).stdout, "kept");
  const snap = await sb.snapshot();
  assert.ok(snap.snapshot.id);
  assert.equal(snap.snapshot.kind, "provider");
  assert.deepEqual([snap.snapshot.sandbox_id, snap.snapshot.pool], [sb.id, "local"]);
  assert.ok(!("export" in snap));
  const listed = await client.sandboxes.list({ label: ["suite", "typescript"], state: "running" });
  assert.ok(listed.some((s) => s.id === sb.id));
  assert.equal((await sb.delete()).state, "deleted");
  assert.equal((await client.sandboxes.get(sb.id)).state, "deleted");
});

test("dry run creates nothing", async () => {
  const ids = async () => (await client.sandboxes.list()).map((s) => s.id);
  const before = await ids();
  const plan = await client.sandboxes.create(FAILOVER, { dryRun: true });
  assert.ok(plan.would_create);
  assert.equal(plan.first_pool, "sim-slow");
  assert.deepEqual(plan.plan.map((p) => p.pool), ["sim-slow", "sim-full", "local", "sim-ok"]);
  assert.deepEqual(await ids(), before);
});

test("a credential is injected for its destination only", async () => {
  const cred = await client.credentials.create("sdk-ts", {
    secret: SECRET,
    destinations: [{ host: "api.allowed.test", ports: [PORT] }],
    apply: { type: "header", name: "authorization", template: "Bearer {secret}" },
    placeholderEnv: "SDK_TOKEN",
  });
  assert.ok(!inspect(cred, { depth: 5 }).includes(SECRET));
  assert.ok((await client.credentials.list()).some((c) => c.name === "sdk-ts"));
  const sb = await client.sandboxes.create({
    provider: "local",
    credentials: ["sdk-ts"],
    network: { allow_domains: ["api.allowed.test", "api.other.test"] },
  });
  const seenBy = async (host, header = true) => {
    const auth = header ? '-H "Authorization: Bearer $SDK_TOKEN"' : "";
    const out = await sb.exec(`curl -s ${auth} https://${host}:${PORT}/cred`);
    assert.equal(out.exitCode, 0, out.stderr);
    return JSON.parse(out.stdout);
  };
  assert.equal((await seenBy("api.allowed.test")).headers.authorization, `Bearer ${SECRET}`);
  // Elsewhere the placeholder is neither replaced nor forwarded: the proxy refuses.
  const other = await seenBy("api.other.test");
  assert.equal(other.error.code, "credential_destination_mismatch");
  assert.ok(!JSON.stringify(other).includes(SECRET));
  assert.equal((await seenBy("api.other.test", false)).headers.authorization, undefined);
  assert.ok(!(await sb.exec("env")).stdout.includes(SECRET));

  await client.credentials.rotate("sdk-ts", { secret: `${SECRET}-2` });
  assert.equal((await seenBy("api.allowed.test")).headers.authorization, `Bearer ${SECRET}-2`);
  await sb.delete();
  await client.credentials.delete("sdk-ts");
  assert.ok(!(await client.credentials.list()).some((c) => c.name === "sdk-ts"));
});

test("a delegated exec-only client cannot write files or delete", async () => {
  const until = new Date(Date.now() + 10 * 60 * 1000);
  const delegation = await sandbox.delegate(["exec"], { agent: "ts-agent", until });
  assert.ok(delegation.token);
  assert.ok(!inspect(delegation).includes(delegation.token));
  assert.ok(!JSON.stringify(delegation).includes(delegation.token));
  assert.deepEqual(delegation.actions, ["exec"]);
  assert.ok(Math.abs(delegation.expiresMs - until.getTime()) < 5000);
  const agent = Client.fromDelegation(delegation);
  const box = agent.sandbox();
  assert.equal((await box.exec("echo from-agent")).stdout, "from-agent\n");
  for (const forbidden of [
    () => box.files.write("/home/user/x", "x"),
    () => box.delete(),
    () => agent.sandboxes.list(),
    () => agent.sandboxes.create(LOCAL),
  ]) {
    const denied = await raises(sdk.PermissionDenied, forbidden);
    assert.equal(denied.code, "delegation_scope");
  }
  assert.deepEqual((await client.delegations.list(sandbox.id)).map((d) => d.id), [delegation.id]);
  await client.delegations.revoke(delegation.id);
  await raises(sdk.Unauthenticated, () => box.exec("true"));
});

test("every error class from a real server condition", async () => {
  const noRetry = new Client({ retry: new RetryPolicy({ maxAttempts: 1 }) });
  const invalid = await raises(sdk.InvalidRequest, () => client.sandboxes.create({ provider: "local", bogus: 1 }));
  assert.equal(invalid.field, "bogus");
  assert.ok(invalid.requestId);
  await raises(sdk.Unauthenticated, () => new Client({ token: "not-a-token" }).pools.list());
  const missing = await raises(sdk.NotFound, () => client.sandboxes.get("sb-does-not-exist"));
  assert.ok(missing.requestId);
  const refused = await raises(sdk.PolicyDenied, () =>
    client.sandboxes.create({ ...LOCAL, labels: { tier: "blocked" } }),
  );
  assert.equal(refused.layer, "creation");
  assert.ok(refused.reasons.some((r) => r.includes("tier = blocked")));
  const nowhere = await raises(sdk.NoEligibleProvider, () => client.sandboxes.create({ regions: ["mars-1"] }));
  assert.ok(nowhere.attempts.length > 0);
  assert.ok(nowhere.attempts.every((a) => a.unmet_requirements.includes("regions")));
  const otherWs = await raises(sdk.PermissionDenied, () =>
    new Client({ token: process.env.SANDGATE_TOKEN_B }).credentials.list({ workspace: "ws-a" }),
  );
  assert.equal(otherWs.code, "forbidden");
  await raises(sdk.PayloadTooLarge, () =>
    client.sandboxes.create({ ...LOCAL, labels: { big: "x".repeat(2 * 1024 * 1024) } }),
  );
  const elsewhere = await client.sandboxes.create({ provider: "sim-late" });
  const unsupported = await raises(sdk.Unsupported, () => elsewhere.exec("true"));
  assert.equal(unsupported.status, 501);
  await elsewhere.delete();
  const unavailable = await raises(sdk.Unavailable, () =>
    noRetry.sandboxes.create({ provider: "sim", routing: { pin_pool: "sim-full" } }),
  );
  assert.equal(unavailable.code, "creation_failed");
  // A keyed create that ends in creation_failed is stored under its key: the retry rule
  // does not send it again (a resend could only replay the same failure).
  const posts = [];
  const counting = new Client({
    retry: new RetryPolicy({ maxAttempts: 3, baseDelay: 0.01 }),
    fetch: (url, init) => {
      if (init?.method === "POST") posts.push(String(url));
      return fetch(url, init);
    },
  });
  const key = `ts-stored-failure-${randomUUID()}`;
  const full = { provider: "sim", routing: { pin_pool: "sim-full" } };
  const stored = await raises(sdk.Unavailable, () => counting.sandboxes.create(full, { idempotencyKey: key }));
  assert.equal(stored.code, "creation_failed");
  assert.equal(stored.status, 503);
  assert.equal(posts.length, 1, posts.join(", "));
  const replayed = await raises(sdk.Unavailable, () => counting.sandboxes.create(full, { idempotencyKey: key }));
  assert.equal(replayed.details.sandbox_id, stored.details.sandbox_id);
  assert.equal(posts.length, 2, posts.join(", "));
  // Two event streams are the gateway's limit: a third is refused, with Retry-After.
  // (Each stream lives a second: a machine stalled that long would free a slot first, so
  // the setup is tried again then.)
  const placing = await client.sandboxes.create(FAILOVER, { wait: false });
  let limited;
  for (let i = 0; i < 3 && !limited; i++) {
    const streams = [client.sandboxes.events(placing.id), client.sandboxes.events(placing.id)];
    const third = noRetry.sandboxes.events(placing.id);
    try {
      await streams[0].next();
      await streams[1].next();
      await third.next();
    } catch (e) {
      if (!(e instanceof sdk.RateLimited)) throw e;
      limited = e;
    } finally {
      for (const s of [...streams, third]) await s.return();
    }
  }
  assert.ok(limited, "a third event stream was never refused");
  assert.equal(limited.retryAfter, 1);
  assert.equal(limited.code, "rate_limited");
});

/** Renames a table of the gateway's database from another process (python3's sqlite3), as an
 * operator's mistake or a broken migration would; the gateway's next statement on it fails. */
function renameTable(from, to) {
  const script =
    "import sqlite3, sys\n" +
    "db = sqlite3.connect(sys.argv[1], timeout=10, isolation_level=None)\n" +
    "db.execute(f'ALTER TABLE {sys.argv[2]} RENAME TO {sys.argv[3]}')\n" +
    "db.close()\n";
  execFileSync("python3", ["-c", script, process.env.SANDGATE_STORE_PATH, from, to], { stdio: "inherit" });
}

test("a failure inside the gateway is an InternalError", async () => {
  // The store's `snapshots` table disappears under the running gateway: the local provider
  // takes the snapshot, sandgate cannot record it, removes it and answers 500 `internal`
  // with a message that names nothing of the cause (that is in its log, under the request id).
  const dir = process.env.SANDGATE_SNAPSHOT_DIR;
  const before = readdirSync(dir).sort();
  renameTable("snapshots", "snapshots_away");
  try {
    const failed = await raises(sdk.InternalError, () => sandbox.snapshot());
    assert.deepEqual([failed.code, failed.status], ["internal", 500]);
    assert.ok(failed.requestId);
    const said = (failed.message + JSON.stringify(failed.details)).toLowerCase();
    for (const leak of ["snapshots", "sqlite", "no such table", "insert", "database", "sql"]) {
      assert.ok(!said.includes(leak), `${leak} in ${said}`);
    }
    // The provider's snapshot that sandgate could not record is not left behind.
    assert.deepEqual(readdirSync(dir).sort(), before);
  } finally {
    renameTable("snapshots_away", "snapshots");
  }
  const again = await sandbox.snapshot();
  assert.deepEqual(readdirSync(dir).sort(), [...before, `${again.snapshot.id}.tar`].sort());
});

test("an operation the hosted provider fails is an UpstreamError", async () => {
  // The pool `daytona` is a hosted provider (the fake Daytona, over a real socket); its
  // toolbox fault makes every command and file call answer 500 until cleared.
  const fault = `${process.env.SANDGATE_FAKE_DAYTONA}/_fake/toolbox-fault`;
  const control = async (method, body) => {
    const answer = await fetch(fault, {
      method,
      headers: { "content-type": "application/json" },
      body: body && JSON.stringify(body),
    });
    assert.equal(answer.status, 204);
  };
  const hosted = await client.sandboxes.create({ provider: "daytona", labels: { suite: "typescript" } });
  try {
    assert.deepEqual([hosted.state, hosted.info.placement.pool], ["running", "daytona"]);
    await hosted.files.write("/home/daytona/note.txt", "kept");
    assert.equal((await hosted.exec("echo up")).stdout, "up\n");
    await control("POST", { status: 500 });
    try {
      const failed = await raises(sdk.UpstreamError, () => hosted.files.list("/home/daytona"));
      assert.deepEqual([failed.status, failed.code], [502, "provider_error"]);
      assert.ok(failed.message.includes("injected fault"), failed.message);
      assert.ok(failed.requestId);
      const read = await raises(sdk.UpstreamError, () => hosted.files.read("/home/daytona/note.txt"));
      assert.equal(read.status, 502);
      assert.ok(read.requestId && read.requestId !== failed.requestId);
      // A command's answer is a stream that has begun (200) before the provider is asked:
      // its failure ends the stream instead, with no exit code.
      const broken = await hosted.exec("echo up");
      assert.equal(broken.exitCode, null);
      assert.ok(broken.stderr.includes("injected fault"), broken.stderr);
      // A provider that does not answer within the account's 2 s request timeout: 504
      // `upstream_timeout`, the same class.
      await control("DELETE");
      await control("POST", { hang_ms: 4000 });
      const started = Date.now();
      const slow = await raises(sdk.UpstreamError, () => hosted.files.list("/home/daytona"));
      assert.deepEqual([slow.status, slow.code], [504, "upstream_timeout"]);
      assert.ok(slow.requestId && Date.now() - started < 3900, `${Date.now() - started} ms`);
    } finally {
      await control("DELETE");
    }
    // The provider failed the operation, not the sandbox: it still runs.
    assert.equal((await client.sandboxes.get(hosted.id)).state, "running");
    assert.equal((await hosted.exec("echo again")).stdout, "again\n");
    assert.equal(await hosted.files.readText("/home/daytona/note.txt"), "kept");
  } finally {
    await hosted.delete();
  }
});

test("pools list every configured pool", async () => {
  const pools = await client.pools.list();
  assert.deepEqual(pools.map((p) => p.pool).sort(), ["daytona", "local", "sim-full", "sim-ok", "sim-slow"]);
});

test("the examples run", async () => {
  // The examples import "@sandgate/sdk" as an application would: resolve it to this package.
  const { mkdtempSync, mkdirSync, symlinkSync, copyFileSync } = await import("node:fs");
  const { tmpdir } = await import("node:os");
  const { join, dirname } = await import("node:path");
  const { fileURLToPath } = await import("node:url");
  const { execFile } = await import("node:child_process");
  const here = dirname(fileURLToPath(import.meta.url));
  const dir = mkdtempSync(join(tmpdir(), "sandgate-examples-"));
  mkdirSync(join(dir, "node_modules", "@sandgate"), { recursive: true });
  symlinkSync(join(here, ".."), join(dir, "node_modules", "@sandgate", "sdk"));
  const examples = join(here, "..", "..", "..", "examples", "sdk", "typescript");
  // The README quickstarts are plain JavaScript too: they must run as written.
  const { readFileSync, writeFileSync } = await import("node:fs");
  for (const [readme, heading, name] of [
    ["README.md", "## SDKs: Python and TypeScript", "root-quickstart.mjs"],
    ["sdk/typescript/README.md", "## Quickstart", "sdk-quickstart.mjs"],
  ]) {
    const text = readFileSync(join(here, "..", "..", "..", readme), "utf8");
    const code = /```ts\n([\s\S]*?)```/.exec(text.slice(text.indexOf(heading)))[1];
    writeFileSync(join(dir, name), code);
  }
  const cases = [
    ["root-quickstart.mjs", ["attempt_ended"]],
    ["sdk-quickstart.mjs", ["attempt_ended"]],
    ["failover.mjs", ["attempt 1 on sim-slow: started", "advance", "runs on local"]],
    ["exec-only-agent.mjs", ["hello from the agent", "files.write refused: delegation_scope"]],
    ["bound-credential.mjs", ["sandbox sees: sgph_", `"authorization":"Bearer ${SECRET}"`]],
  ];
  for (const [example, expected] of cases) {
    if (!example.includes("quickstart")) copyFileSync(join(examples, example), join(dir, example));
    const env = { ...process.env, EXAMPLE_HOST: "api.allowed.test", EXAMPLE_PORT: String(PORT), EXAMPLE_SECRET: SECRET };
    const stdout = await new Promise((resolve, reject) =>
      execFile("node", [join(dir, example)], { env, timeout: 120_000 }, (err, out, errOut) =>
        err ? reject(new Error(`${example}: ${err}\n${out}\n${errOut}`)) : resolve(out),
      ),
    );
    for (const text of expected) assert.ok(stdout.includes(text), `${example}:\n${stdout}`);
    assert.ok(stdout.split(SECRET).length <= 2, stdout);
  }
});
