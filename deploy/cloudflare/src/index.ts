// sandgate's bridge Worker: a small HTTP API (src/api.ts, README.md) over @cloudflare/sandbox,
// because a Cloudflare Sandbox is a Durable Object that only a Worker can reach.
import { DurableObject } from "cloudflare:workers";
import {
  ContainerUnavailableError,
  getSandbox,
  parseSSEStream,
  Sandbox,
  type ExecEvent,
} from "@cloudflare/sandbox";
import type {
  CreateSandboxRequest,
  ErrorCode,
  ErrorResponse,
  ExecRequest,
  ExecStreamEvent,
  ListSandboxesResponse,
  Outbound,
  SandboxInfo,
} from "./api";

// The SDK's Worker entrypoint for outbound interception must be exported by the Worker.
export { ContainerProxy } from "@cloudflare/sandbox";

export interface Env {
  Sandbox: DurableObjectNamespace<SandgateSandbox>;
  SandboxIndex: DurableObjectNamespace<SandboxIndex>;
  /** The bearer secret sandgate sends (`wrangler secret put SANDGATE_BRIDGE_TOKEN`). */
  SANDGATE_BRIDGE_TOKEN: string;
}

const OUTBOUND_KEY = "sandgate:outbound";

/**
 * The SDK's Sandbox, closed by default: a container starts with no internet until its create
 * applied the outbound settings, so a sandbox whose create failed halfway is never open.
 */
export class SandgateSandbox extends Sandbox<Env> {
  override enableInternet = false;

  constructor(ctx: DurableObjectState<{}>, env: Env) {
    super(ctx, env);
    // An evicted Durable Object is rebuilt from its constructor; the outbound settings are
    // reapplied from storage before any request is served so a restart cannot open it.
    void ctx.blockConcurrencyWhile(async () => {
      const saved = await ctx.storage.get<Outbound>(OUTBOUND_KEY);
      if (saved) {
        this.enableInternet = saved.enableInternet;
        await this.setAllowedHosts(saved.allowedHosts);
      }
    });
  }

  /** Sets and stores the container's outbound network; called before the container starts. */
  async applyOutbound(outbound: Outbound): Promise<void> {
    await this.ctx.storage.put(OUTBOUND_KEY, outbound);
    this.enableInternet = outbound.enableInternet;
    await this.setAllowedHosts(outbound.allowedHosts);
  }
}

/**
 * The bridge's inventory: one Durable Object (named "index") holding every sandbox's record,
 * because Cloudflare offers no listing of Durable Objects and sandgate reconciles by label.
 * A single object keeps the listing strongly consistent (KV's listing is not).
 */
export class SandboxIndex extends DurableObject<Env> {
  async put(info: SandboxInfo): Promise<void> {
    await this.ctx.storage.put(`sandbox:${info.id}`, info);
  }

  async get(id: string): Promise<SandboxInfo | undefined> {
    return this.ctx.storage.get<SandboxInfo>(`sandbox:${id}`);
  }

  async remove(id: string): Promise<void> {
    await this.ctx.storage.delete(`sandbox:${id}`);
  }

  async list(labels: Record<string, string>): Promise<SandboxInfo[]> {
    const all = await this.ctx.storage.list<SandboxInfo>({ prefix: "sandbox:" });
    return [...all.values()].filter((s) =>
      Object.entries(labels).every(([k, v]) => s.labels[k] === v),
    );
  }
}

class BridgeError extends Error {
  constructor(
    readonly status: number,
    readonly code: ErrorCode,
    message: string,
    readonly retryAfterSeconds?: number,
  ) {
    super(message);
  }
}

function errorResponse(e: BridgeError): Response {
  const body: ErrorResponse = { error: { code: e.code, message: e.message } };
  const headers: Record<string, string> = {};
  if (e.retryAfterSeconds !== undefined) headers["Retry-After"] = String(e.retryAfterSeconds);
  return Response.json(body, { status: e.status, headers });
}

/** A thrown SDK error as the bridge's error; its message never carries the bearer secret. */
function classify(e: unknown): BridgeError {
  if (e instanceof BridgeError) return e;
  if (e instanceof ContainerUnavailableError) {
    return new BridgeError(503, "capacity", e.message, 5);
  }
  const code = (e as { code?: unknown } | null)?.code;
  if (code === "FILE_NOT_FOUND") return new BridgeError(404, "file_not_found", "no such file");
  const message = e instanceof Error ? e.message : String(e);
  return new BridgeError(500, "internal", message);
}

/** Compares without an early exit so the time taken does not reveal a prefix of the secret. */
function authorized(request: Request, env: Env): boolean {
  const expected = `Bearer ${env.SANDGATE_BRIDGE_TOKEN ?? ""}`;
  const given = request.headers.get("Authorization") ?? "";
  if (!env.SANDGATE_BRIDGE_TOKEN || given.length !== expected.length) return false;
  let diff = 0;
  for (let i = 0; i < expected.length; i++) diff |= expected.charCodeAt(i) ^ given.charCodeAt(i);
  return diff === 0;
}

const ID = /^[a-z0-9][a-z0-9-]{0,62}$/;

function checkId(id: string): string {
  if (!ID.test(id)) throw new BridgeError(400, "invalid_request", "id must match [a-z0-9][a-z0-9-]{0,62}");
  return id;
}

function isStringMap(v: unknown): v is Record<string, string> {
  return (
    typeof v === "object" && v !== null && !Array.isArray(v) &&
    Object.values(v).every((x) => typeof x === "string")
  );
}

function parseCreate(body: unknown): CreateSandboxRequest {
  const b = body as Partial<CreateSandboxRequest> | null;
  const o = b?.outbound;
  if (
    !b || typeof b.id !== "string" || !isStringMap(b.labels) || !isStringMap(b.env) ||
    !o || typeof o.enableInternet !== "boolean" || !Array.isArray(o.allowedHosts) ||
    !o.allowedHosts.every((h) => typeof h === "string") ||
    (b.sleepAfterSeconds !== undefined && typeof b.sleepAfterSeconds !== "number")
  ) {
    throw new BridgeError(400, "invalid_request", "body is not a CreateSandboxRequest");
  }
  checkId(b.id);
  return b as CreateSandboxRequest;
}

function index(env: Env): DurableObjectStub<SandboxIndex> {
  return env.SandboxIndex.get(env.SandboxIndex.idFromName("index"));
}

function sameLabels(a: Record<string, string>, b: Record<string, string>): boolean {
  const ka = Object.keys(a);
  return ka.length === Object.keys(b).length && ka.every((k) => a[k] === b[k]);
}

async function create(request: Request, env: Env): Promise<Response> {
  const req = parseCreate(await request.json().catch(() => null));
  const existing = await index(env).get(req.id);
  if (existing) {
    if (!sameLabels(existing.labels, req.labels)) {
      throw new BridgeError(409, "conflict", "a sandbox with this id exists with other labels");
    }
    return Response.json(existing, { status: 200 });
  }
  const info: SandboxInfo = {
    id: req.id,
    state: "creating",
    labels: req.labels,
    envKeys: Object.keys(req.env).sort(),
    outbound: req.outbound,
    createdAt: new Date().toISOString(),
  };
  // Recorded before the container exists, so a create cut short is still found by its labels.
  await index(env).put(info);
  const sandbox = getSandbox(env.Sandbox, req.id, {
    labels: req.labels,
    sleepAfter: req.sleepAfterSeconds,
  });
  try {
    // Outbound first: the container must not start before it is locked.
    await sandbox.applyOutbound(req.outbound);
    await sandbox.setLabels(req.labels);
    await sandbox.setEnvVars(req.env);
    // Starts the container so the answer means it runs.
    const ready = await sandbox.exec("true");
    if (ready.exitCode !== 0) throw new BridgeError(500, "internal", "the container did not start");
  } catch (e) {
    // Nothing is left behind for a create that failed: the container is destroyed and the
    // record removed, so the answer (e.g. 503 capacity) proves no sandbox runs.
    await sandbox.destroy().catch(() => undefined);
    await index(env).remove(req.id);
    throw e;
  }
  const running: SandboxInfo = { ...info, state: "running" };
  await index(env).put(running);
  return Response.json(running, { status: 201 });
}

async function describe(env: Env, id: string): Promise<Response> {
  const info = await index(env).get(checkId(id));
  if (!info) throw new BridgeError(404, "not_found", "no such sandbox");
  if (info.state === "running") {
    const state = await getSandbox(env.Sandbox, id).getState();
    if (state.status === "stopped" || state.status === "stopped_with_code") {
      return Response.json({ ...info, state: "stopped" } satisfies SandboxInfo);
    }
  }
  return Response.json(info);
}

async function list(url: URL, env: Env): Promise<Response> {
  const labels: Record<string, string> = {};
  for (const pair of url.searchParams.getAll("label")) {
    const at = pair.indexOf("=");
    if (at <= 0) throw new BridgeError(400, "invalid_request", "label must be key=value");
    labels[pair.slice(0, at)] = pair.slice(at + 1);
  }
  const body: ListSandboxesResponse = { sandboxes: await index(env).list(labels) };
  return Response.json(body);
}

async function destroy(env: Env, id: string): Promise<Response> {
  checkId(id);
  // Destroying a sandbox that never ran is a no-op in the SDK; absent answers 204 as well.
  await getSandbox(env.Sandbox, id).destroy();
  await index(env).remove(id);
  return new Response(null, { status: 204 });
}

async function requireSandbox(env: Env, id: string): Promise<void> {
  if (!(await index(env).get(checkId(id)))) throw new BridgeError(404, "not_found", "no such sandbox");
}

function sse(event: ExecStreamEvent): string {
  return `event: ${event.type}\ndata: ${JSON.stringify(event)}\n\n`;
}

/** The SDK's exec events as the bridge's: output, then exactly one `exit` or `error`. */
function translate(event: ExecEvent): ExecStreamEvent | undefined {
  switch (event.type) {
    case "stdout":
    case "stderr":
      return { type: event.type, data: event.data ?? "" };
    case "complete":
      return { type: "exit", exitCode: event.exitCode ?? event.result?.exitCode ?? -1 };
    case "error":
      return { type: "error", message: event.error ?? "exec failed" };
    default:
      return undefined;
  }
}

async function exec(request: Request, env: Env, id: string): Promise<Response> {
  await requireSandbox(env, id);
  const req = (await request.json().catch(() => null)) as ExecRequest | null;
  if (!req || typeof req.command !== "string" || (req.env !== undefined && !isStringMap(req.env))) {
    throw new BridgeError(400, "invalid_request", "body is not an ExecRequest");
  }
  const stream = await getSandbox(env.Sandbox, id).execStream(req.command, {
    cwd: req.cwd,
    env: req.env,
    timeout: req.timeoutMs,
  });
  const encoder = new TextEncoder();
  const { readable, writable } = new TransformStream<Uint8Array, Uint8Array>();
  const pump = async () => {
    const writer = writable.getWriter();
    let ended = false;
    try {
      for await (const event of parseSSEStream<ExecEvent>(stream)) {
        const out = translate(event);
        if (!out) continue;
        await writer.write(encoder.encode(sse(out)));
        if (out.type === "exit" || out.type === "error") {
          ended = true;
          break;
        }
      }
      if (!ended) await writer.write(encoder.encode(sse({ type: "error", message: "the stream ended without an exit" })));
    } catch (e) {
      await writer.write(encoder.encode(sse({ type: "error", message: classify(e).message })));
    } finally {
      await writer.close();
    }
  };
  void pump();
  return new Response(readable, {
    headers: { "Content-Type": "text/event-stream", "Cache-Control": "no-store" },
  });
}

function base64(bytes: Uint8Array): string {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(s);
}

function unbase64(s: string): Uint8Array {
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

async function file(request: Request, env: Env, id: string, path: string): Promise<Response> {
  await requireSandbox(env, id);
  if (!path || path.split("/").includes("..")) {
    throw new BridgeError(400, "invalid_request", "the file path must be absolute, without '..'");
  }
  const sandbox = getSandbox(env.Sandbox, id);
  const absolute = `/${path}`;
  if (request.method === "PUT") {
    const bytes = new Uint8Array(await request.arrayBuffer());
    // Base64 so binary content survives: the SDK's string content is otherwise text.
    await sandbox.writeFile(absolute, base64(bytes), { encoding: "base64" });
    return new Response(null, { status: 204 });
  }
  const read = await sandbox.readFile(absolute, { encoding: "base64" });
  const bytes = read.encoding === "base64" ? unbase64(read.content) : new TextEncoder().encode(read.content);
  return new Response(bytes, { headers: { "Content-Type": "application/octet-stream" } });
}

async function route(request: Request, env: Env): Promise<Response> {
  const url = new URL(request.url);
  const parts = url.pathname.split("/").filter((p, i) => i > 0 || p !== "");
  // ["", "v1", "sandbox", id?, op?, ...path]
  if (parts[1] !== "v1" || parts[2] !== "sandbox") throw new BridgeError(404, "not_found", "no such route");
  const id = parts[3] ? decodeURIComponent(parts[3]) : undefined;
  const op = parts[4];
  const m = request.method;
  if (id === undefined) {
    if (m === "POST") return create(request, env);
    if (m === "GET") return list(url, env);
  } else if (op === undefined) {
    if (m === "GET") return describe(env, id);
    if (m === "DELETE") return destroy(env, id);
  } else if (op === "exec" && m === "POST") {
    return exec(request, env, id);
  } else if (op === "file" && (m === "GET" || m === "PUT")) {
    return file(request, env, id, parts.slice(5).map(decodeURIComponent).join("/"));
  }
  throw new BridgeError(405, "invalid_request", `${m} is not served here`);
}

export default {
  async fetch(request: Request, env: Env): Promise<Response> {
    if (!authorized(request, env)) {
      return errorResponse(new BridgeError(401, "unauthorized", "missing or wrong bearer token"));
    }
    try {
      return await route(request, env);
    } catch (e) {
      return errorResponse(classify(e));
    }
  },
} satisfies ExportedHandler<Env>;
