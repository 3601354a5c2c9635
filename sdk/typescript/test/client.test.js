// Unit tests of the client's stream handling with a stand-in `fetch` (no gateway; the
// scenario suite in scenarios/ runs the same code against a real one).
import { test } from "node:test";
import assert from "node:assert/strict";
import { inspect } from "node:util";
import * as sdk from "../dist/index.js";

const sse = (events) =>
  events.map(([type, id, data]) => `event: ${type}\nid: ${id}\ndata: ${JSON.stringify(data)}\n\n`).join("");

/** A fetch answering each request with the next of `answers`, recording the requests. */
function fakeFetch(answers) {
  const requests = [];
  const fetch = async (url, init) => {
    requests.push({ url: String(url), init });
    const [status, body, type] = answers.shift();
    return new Response(body, { status, headers: { "content-type": type ?? "text/event-stream" } });
  };
  return { fetch, requests };
}

test("a stream that ends before done is resumed with Last-Event-ID", async () => {
  const { fetch, requests } = fakeFetch([
    [200, ": keep-alive\n\n" + sse([["state", "1", { state: "provisioning" }], ["attempt_started", "2", { pool: "a" }]])],
    [200, sse([["attempt_ended", "3", { pool: "a" }], ["done", "4", { state: "running" }]])],
  ]);
  const client = new sdk.Client({ baseUrl: "http://gw", token: "t", fetch });
  const seen = [];
  for await (const e of client.sandboxes.events("sb-1")) seen.push([e.type, e.id]);
  assert.deepEqual(seen, [["state", "1"], ["attempt_started", "2"], ["attempt_ended", "3"], ["done", "4"]]);
  assert.equal(requests.length, 2);
  assert.equal(requests[0].init.headers["last-event-id"], undefined);
  assert.equal(requests[1].init.headers["last-event-id"], "2");
});

test("exec output keeps its order and decodes base64 chunks", async () => {
  const lines = [
    { type: "started", exec_id: "ex-1" },
    { type: "stdout", text: "a\n" },
    { type: "stderr", base64: "//4=" },
    { type: "stdout", text: "b\n" },
    { type: "exit", code: 2, signal: null, reason: "exited" },
  ];
  const { fetch, requests } = fakeFetch([[200, lines.map((l) => JSON.stringify(l)).join("\n") + "\n", "application/x-ndjson"]]);
  const client = new sdk.Client({ baseUrl: "http://gw", token: "t", fetch });
  const result = await client.sandbox("sb-1").exec("echo a", { timeout: 2 });
  assert.deepEqual(JSON.parse(requests[0].init.body), { argv: ["sh", "-c", "echo a"], timeout_ms: 2000 });
  assert.deepEqual([result.exitCode, result.stdout, [...result.stderrBytes]], [2, "a\nb\n", [0xff, 0xfe]]);
  assert.deepEqual(result.events.map((e) => e.type), ["stdout", "stderr", "stdout"]);
  assert.equal(result.execId, "ex-1");
});

test("tokens stay out of inspect and JSON", () => {
  const client = new sdk.Client({ baseUrl: "http://gw", token: "tok-hidden" });
  const d = new sdk.Delegation({ id: "dg-1", sandbox_id: "sb-1", actions: ["exec"] }, "sgd_hidden");
  for (const v of [client, d]) {
    assert.ok(!inspect(v, { depth: 5 }).includes("hidden"));
    assert.ok(!JSON.stringify(v).includes("hidden"));
  }
  assert.equal(d.token, "sgd_hidden");
  const info = sdk.sandboxInfo({ id: "sb-1", egress: { token: "egress-hidden", proxy: "p" } });
  assert.ok(!JSON.stringify(info).includes("egress-hidden"));
});
