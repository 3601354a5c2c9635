/**
 * The client: one gateway, one API token (or one delegated token), global `fetch`.
 *
 * Every failure the gateway answers throws the class of `errors.ts` its code maps to, with
 * the request id from `X-Request-Id`. Requests are sent again only under `RetryPolicy`'s
 * rule (idempotent methods, or a create with an `Idempotency-Key`; on 429/503 only).
 */

import { SandgateError, errorFromResponse } from "./errors.js";
import { RetryPolicy } from "./retry.js";
import type {
  CreateBody,
  CredentialBody,
  CredentialList,
  CredentialMetadata,
  CredentialView,
  DelegationList,
  DryRunPlan,
  ExecBody,
  Explanation,
  FileList,
  MintBody,
  MintedDelegation,
  PoolView,
  PoolsView,
  PortAccess,
  SandboxPage,
  SandboxView,
  SnapshotBody,
  SnapshotTaken,
  TimeoutBody,
} from "./schema.js";
import {
  type CreateEvent,
  type Credential,
  type ExecEvent,
  type ExecResult,
  type FileEntry,
  type Json,
  type Plan,
  type SandboxInfo,
  Delegation,
  credential,
  plan,
  sandboxInfo,
} from "./models.js";

export interface ClientOptions {
  /** Defaults to `SANDGATE_URL` (where `process.env` exists). */
  baseUrl?: string;
  /** Defaults to `SANDGATE_TOKEN`. */
  token?: string;
  /** The default workspace of workspace-scoped calls (credentials); `SANDGATE_WORKSPACE`. */
  workspace?: string;
  retry?: RetryPolicy;
  /** Another `fetch` (tests, instrumentation). */
  fetch?: typeof fetch;
  /** Seconds for a non-streamed request (default 30). */
  timeout?: number;
}

export type EventCallback = (event: CreateEvent) => void;
export type Command = string | string[];

const inspect = Symbol.for("nodejs.util.inspect.custom");

function env(name: string): string | undefined {
  const p = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  return p?.env?.[name];
}

const sleep = (seconds: number) => new Promise((r) => setTimeout(r, seconds * 1000));
const seg = (v: string) => encodeURIComponent(v);

function connectionError(e: unknown): SandgateError {
  // Not an answer from the gateway: no status, never retried (it may have arrived).
  const message = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
  return new SandgateError("connection_failed", message);
}

interface RequestInit2 {
  json?: unknown;
  body?: Uint8Array | string;
  params?: Record<string, string | number | boolean | undefined>;
  headers?: Record<string, string>;
  idempotencyKey?: string;
  stream?: boolean;
}

export class Client {
  readonly baseUrl: string;
  workspace: string | undefined;
  readonly retry: RetryPolicy;
  readonly sandboxes: Sandboxes;
  readonly routes: Routes;
  readonly pools: Pools;
  readonly credentials: Credentials;
  readonly delegations: Delegations;
  #token: string;
  #fetch: typeof fetch;
  #timeout: number;
  #delegatedSandbox: string | undefined;

  constructor(options: ClientOptions = {}) {
    const baseUrl = options.baseUrl ?? env("SANDGATE_URL");
    const token = options.token ?? env("SANDGATE_TOKEN");
    if (!baseUrl) throw new Error("no gateway URL: pass baseUrl or set SANDGATE_URL");
    if (!token) throw new Error("no API token: pass token or set SANDGATE_TOKEN");
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.#token = token;
    this.workspace = options.workspace ?? env("SANDGATE_WORKSPACE");
    this.retry = options.retry ?? new RetryPolicy();
    this.#fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.#timeout = options.timeout ?? 30;
    this.sandboxes = new Sandboxes(this);
    this.routes = new Routes(this);
    this.pools = new Pools(this);
    this.credentials = new Credentials(this);
    this.delegations = new Delegations(this);
  }

  /**
   * The agent's side of a delegation: a client holding only the delegated token. The
   * gateway lets it do exactly the delegation's actions on its sandbox (`client.sandbox()`);
   * anything else throws `PermissionDenied` (`delegation_scope`).
   */
  static fromDelegation(
    delegation: Delegation | string,
    options: Omit<ClientOptions, "token"> = {},
  ): Client {
    const token = typeof delegation === "string" ? delegation : delegation.token;
    if (!token) throw new Error("this Delegation has no token: only the mint's answer carries it");
    const client = new Client({ ...options, token });
    if (typeof delegation !== "string") client.#delegatedSandbox = delegation.sandboxId;
    return client;
  }

  /** A handle on a sandbox without reading it (with no id: the delegation's sandbox). */
  sandbox(id?: string): Sandbox {
    const sandboxId = id ?? this.#delegatedSandbox;
    if (!sandboxId) throw new Error("which sandbox? pass its id");
    return new Sandbox(this, sandboxId);
  }

  toJSON(): Json {
    return { baseUrl: this.baseUrl };
  }

  [inspect](): string {
    return `Client { baseUrl: '${this.baseUrl}' }`;
  }

  /** @internal One request, retried per the retry rule; throws the mapped error. */
  async request(method: string, path: string, init: RequestInit2 = {}): Promise<Response> {
    const url = new URL(this.baseUrl + path);
    for (const [k, v] of Object.entries(init.params ?? {})) {
      if (v !== undefined) url.searchParams.set(k, String(v));
    }
    const headers: Record<string, string> = {
      authorization: `Bearer ${this.#token}`,
      ...init.headers,
    };
    let body: BodyInit | undefined;
    if (init.json !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(init.json);
    } else if (init.body !== undefined) {
      body = init.body as BodyInit;
    }
    if (init.idempotencyKey) headers["idempotency-key"] = init.idempotencyKey;
    for (let attempt = 1; ; attempt++) {
      let response: Response;
      try {
        response = await this.#fetch(url, {
          method,
          headers,
          body,
          // Streams (exec output, events) may be quiet for long: no overall deadline.
          signal: init.stream ? undefined : AbortSignal.timeout(this.#timeout * 1000),
        });
      } catch (e) {
        throw connectionError(e);
      }
      if (response.status < 400) return response;
      const text = await response.text();
      let parsed: unknown = undefined;
      try {
        parsed = text ? JSON.parse(text) : undefined;
      } catch {
        parsed = undefined;
      }
      const error = errorFromResponse(response.status, parsed, response.headers);
      const delay = this.retry.delay(attempt, method, error, init.idempotencyKey);
      if (delay === undefined) throw error;
      await sleep(delay);
    }
  }

  /** @internal */
  async json<T = Json>(method: string, path: string, init: RequestInit2 = {}): Promise<T> {
    const response = await this.request(method, path, init);
    const text = await response.text();
    return (text ? JSON.parse(text) : undefined) as T;
  }

  /** @internal */
  ws(workspace?: string): string {
    const ws = workspace ?? this.workspace;
    if (!ws) throw new Error("which workspace? pass workspace here or to new Client({workspace})");
    return ws;
  }
}

/** Lines of a streamed body, decoded as UTF-8 across chunk boundaries. */
async function* lines(body: ReadableStream<Uint8Array> | null): AsyncGenerator<string> {
  if (!body) return;
  const decoder = new TextDecoder();
  let buffered = "";
  const reader = body.getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffered += decoder.decode(value, { stream: true });
      let at: number;
      while ((at = buffered.indexOf("\n")) >= 0) {
        yield buffered.slice(0, at).replace(/\r$/, "");
        buffered = buffered.slice(at + 1);
      }
    }
    buffered += decoder.decode();
    if (buffered) yield buffered;
  } finally {
    await reader.cancel().catch(() => {});
  }
}

/** Server-sent events parser: fed lines, gives complete events. */
class SseParser {
  #event = "";
  #id: string | undefined;
  #data: string[] = [];

  feed(line: string): CreateEvent | undefined {
    if (line === "") {
      if (this.#data.length === 0) {
        this.#event = "";
        return undefined;
      }
      const data = this.#data.join("\n");
      const event = { type: this.#event || "message", id: this.#id, data: data ? JSON.parse(data) : {} };
      this.#event = "";
      this.#data = [];
      return event;
    }
    if (line.startsWith(":")) return undefined;
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") this.#event = value;
    else if (name === "data") this.#data.push(value);
    else if (name === "id") this.#id = value;
    return undefined;
  }
}

// The status a create that ended in `failed` answers with (the gateway's `failed_create`).
const FAILED_CREATE_STATUS: Record<string, number> = {
  forbidden: 403,
  policy_denied: 403,
  billing_refused: 403,
  invalid_request: 422,
};

function failedCreateError(done: Json, requestId: string | null): SandgateError {
  const stored = (done["error"] as Json | null) ?? {};
  const inner = (stored["error"] as Json | undefined) ?? {};
  const code = typeof inner["code"] === "string" ? (inner["code"] as string) : "creation_failed";
  const headers = new Headers(requestId ? { "x-request-id": requestId } : {});
  const body = stored["error"] ? stored : { error: { code } };
  return errorFromResponse(FAILED_CREATE_STATUS[code] ?? 503, body, headers);
}

export interface CreateOptions {
  idempotencyKey?: string;
  /** Return once the sandbox runs (default true), following its events. */
  wait?: boolean;
  /** Each event of the create (every attempt's start and end) as it happens. */
  onEvent?: EventCallback;
  /** Plan only: nothing is created. */
  dryRun?: boolean;
  /** Seconds to follow the create before giving up (default: until it ends). */
  timeout?: number;
}

export class Sandboxes {
  readonly #c: Client;
  constructor(client: Client) {
    this.#c = client;
  }

  /**
   * Create a sandbox (route, admit, place with failover). With `wait` (the default) this
   * resolves once the create is over (the sandbox runs; a replay of a create whose sandbox was
   * deleted since resolves to it deleted), following the create's events, and throws the
   * create's error when it fails. `dryRun: true` resolves to the `Plan`; nothing is created. The same
   * `idempotencyKey` and body return the same sandbox (`egressToken` on the first answer only).
   */
  create(body: CreateBody | undefined, options: CreateOptions & { dryRun: true }): Promise<Plan>;
  create(body?: CreateBody, options?: CreateOptions & { dryRun?: false }): Promise<Sandbox>;
  async create(body: CreateBody = {} as CreateBody, options: CreateOptions = {}): Promise<Sandbox | Plan> {
    if (options.dryRun) {
      return plan(await this.#c.json<DryRunPlan>("POST", "/v1/sandboxes", { json: { ...body, dry_run: true } }));
    }
    const response = await this.#c.request("POST", "/v1/sandboxes", {
      json: body,
      idempotencyKey: options.idempotencyKey,
    });
    const raw = (await response.json()) as SandboxView;
    const token = raw.egress?.token ?? undefined;
    const sandbox = new Sandbox(this.#c, raw.id, sandboxInfo(raw), token);
    const placing = ["pending", "provisioning", "reconciling"].includes(sandbox.info?.state ?? "");
    // Running, or a replay of a create already over (failed ones answer an error).
    if (options.wait === false || (!placing && !options.onEvent)) return sandbox;
    const deadline = options.timeout === undefined ? undefined : Date.now() + options.timeout * 1000;
    let done: Json | undefined;
    for await (const event of this.events(sandbox.id, { deadline })) {
      options.onEvent?.(event);
      if (event.type === "done") done = event.data;
    }
    if (!done) throw new SandgateError("timeout", `sandbox ${sandbox.id} was still being placed`);
    if (done["state"] === "failed") {
      throw failedCreateError(done, response.headers.get("x-request-id"));
    }
    await sandbox.refresh();
    return sandbox;
  }

  /**
   * The create's events until `done`. A stream that ends early (the gateway's stream
   * lifetime, a dropped connection) resumes with `Last-Event-ID`: nothing lost or repeated.
   */
  async *events(
    id: string,
    options: { lastEventId?: string; deadline?: number } = {},
  ): AsyncGenerator<CreateEvent> {
    let last = options.lastEventId;
    let failures = 0;
    while (options.deadline === undefined || Date.now() < options.deadline) {
      try {
        const response = await this.#c.request("GET", `/v1/sandboxes/${seg(id)}/events`, {
          headers: last ? { "last-event-id": last } : {},
          stream: true,
        });
        if (response.status === 204) return;
        const parser = new SseParser();
        let received = false;
        for await (const line of lines(response.body)) {
          const event = parser.feed(line);
          if (!event) continue;
          failures = 0;
          received = true;
          last = event.id ?? last;
          yield event;
          if (event.type === "done") return;
          if (options.deadline !== undefined && Date.now() >= options.deadline) return;
        }
        // Ended with nothing new (no `done`): the same as a dropped connection.
        if (!received && ++failures > 5) {
          throw new SandgateError("events_ended", `the events of ${id} stopped before \`done\``);
        }
      } catch (e) {
        if (e instanceof SandgateError && e.code !== "connection_failed") throw e;
        failures += 1;
        if (failures > 5) throw e instanceof SandgateError ? e : connectionError(e);
      }
      await sleep(Math.min(0.2 * (failures + 1), 2));
    }
  }

  async get(id: string): Promise<Sandbox> {
    const raw = await this.#c.json<SandboxView>("GET", `/v1/sandboxes/${seg(id)}`);
    return new Sandbox(this.#c, raw.id, sandboxInfo(raw));
  }

  /** Every sandbox matching the filters (all pages), oldest first. */
  async list(
    filter: { state?: string; label?: [string, string]; workspace?: string; pageSize?: number } = {},
  ): Promise<Sandbox[]> {
    const params: Record<string, string | number | undefined> = {
      limit: filter.pageSize ?? 100,
      state: filter.state,
      workspace: filter.workspace,
      label: filter.label ? `${filter.label[0]}=${filter.label[1]}` : undefined,
    };
    const out: Sandbox[] = [];
    for (;;) {
      const page = await this.#c.json<SandboxPage>("GET", "/v1/sandboxes", { params });
      for (const raw of page.sandboxes ?? []) out.push(new Sandbox(this.#c, raw.id, sandboxInfo(raw)));
      if (!page.next_cursor) return out;
      params["cursor"] = page.next_cursor;
    }
  }

  async delete(id: string): Promise<Sandbox> {
    const raw = await this.#c.json<SandboxView>("DELETE", `/v1/sandboxes/${seg(id)}`);
    return new Sandbox(this.#c, raw.id, sandboxInfo(raw));
  }
}

export interface ExecOptions {
  env?: Record<string, string>;
  cwd?: string;
  /** Seconds; the command's process tree is killed when it passes. */
  timeout?: number;
  onStdout?: (data: Uint8Array) => void;
  onStderr?: (data: Uint8Array) => void;
}

/** A sandbox: what the gateway last said about it (`info`) and its operations. */
export class Sandbox {
  readonly id: string;
  readonly files: Files;
  info: SandboxInfo | undefined;
  readonly #c: Client;
  #egressToken: string | undefined;

  constructor(client: Client, id: string, info?: SandboxInfo, egressToken?: string) {
    this.#c = client;
    this.id = id;
    this.info = info;
    this.files = new Files(client, id);
    this.#egressToken = egressToken;
  }

  get state(): string | undefined {
    return this.info?.state;
  }

  /** Shown once, by the create that made the sandbox. */
  get egressToken(): string | undefined {
    return this.#egressToken;
  }

  toJSON(): Json {
    return { id: this.id, info: this.info };
  }

  [inspect](): string {
    return `Sandbox { id: '${this.id}', state: '${this.info?.state}', pool: '${this.info?.placement?.pool}' }`;
  }

  #path(rest: string): string {
    return `/v1/sandboxes/${seg(this.id)}${rest}`;
  }

  async refresh(): Promise<this> {
    this.info = sandboxInfo(await this.#c.json<SandboxView>("GET", this.#path("")));
    return this;
  }

  /**
   * Run `command` (a string runs with `sh -c`; an array is the argv). Resolves to the
   * result once it ends, output streamed to `onStdout`/`onStderr` as it comes; with
   * `stream: true` returns an `ExecStream` to iterate. A non-zero exit is a result.
   */
  exec(command: Command, options: ExecOptions & { stream: true }): Promise<ExecStream>;
  exec(command: Command, options?: ExecOptions & { stream?: false }): Promise<ExecResult>;
  async exec(command: Command, options: ExecOptions & { stream?: boolean } = {}): Promise<ExecResult | ExecStream> {
    const body: ExecBody = { argv: typeof command === "string" ? ["sh", "-c", command] : [...command] };
    if (options.env) body.env = options.env;
    if (options.cwd !== undefined) body.cwd = options.cwd;
    if (options.timeout !== undefined) body.timeout_ms = Math.max(1, Math.round(options.timeout * 1000));
    const response = await this.#c.request("POST", this.#path("/exec"), { json: body, stream: true });
    const execution = new ExecStream(this.#c, this.id, response);
    if (options.stream) return execution;
    for await (const event of execution) {
      if (event.type === "stdout") options.onStdout?.(event.data);
      else if (event.type === "stderr") options.onStderr?.(event.data);
    }
    return execution.result!;
  }

  async #transition(op: string): Promise<this> {
    this.info = sandboxInfo(await this.#c.json<SandboxView>("POST", this.#path(`/${op}`)));
    return this;
  }
  pause(): Promise<this> {
    return this.#transition("pause");
  }
  resume(): Promise<this> {
    return this.#transition("resume");
  }
  stop(): Promise<this> {
    return this.#transition("stop");
  }
  start(): Promise<this> {
    return this.#transition("start");
  }

  /** Delete the sandbox `ttlSecs` from now (longer or shorter than before). */
  async setLifetime(ttlSecs: number): Promise<this> {
    const body: TimeoutBody = { ttl_secs: ttlSecs };
    this.info = sandboxInfo(await this.#c.json<SandboxView>("POST", this.#path("/timeout"), { json: body }));
    return this;
  }

  /** `{snapshot: {id, kind, ...}, export?}`; create from it with `{snapshot: id}`. */
  async snapshot(options: SnapshotBody = {}): Promise<SnapshotTaken> {
    const body = Object.keys(options).length ? options : undefined;
    return this.#c.json<SnapshotTaken>("POST", this.#path("/snapshot"), { json: body });
  }

  /**
   * How to reach `port` of the sandbox through the gateway's ports listener: `{url, host,
   * port, public, token, token_header}`; send `token` in the `token_header` header unless
   * `public`.
   */
  async port(port: number): Promise<PortAccess> {
    return this.#c.json<PortAccess>("GET", this.#path(`/ports/${Math.trunc(port)}`));
  }

  async delete(): Promise<this> {
    this.info = sandboxInfo(await this.#c.json<SandboxView>("DELETE", this.#path("")));
    return this;
  }

  /**
   * Mint a capability: `actions` (e.g. `["exec"]`) on this sandbox for `agent`, until
   * `until` (or for `ttlSecs`). Give the agent `Client.fromDelegation(d)`.
   */
  delegate(actions: string[], options: { agent: string; until?: Date; ttlSecs?: number }): Promise<Delegation> {
    return this.#c.delegations.mint(this.id, actions, options);
  }
}

/**
 * A running command's output as `ExecEvent`s, in the order sent. `result` is set once
 * `exit` arrives; `close()` (or breaking out of the loop) drops the connection, which
 * makes the gateway kill the process tree.
 */
export class ExecStream implements AsyncIterable<ExecEvent> {
  execId: string | undefined;
  result: ExecResult | undefined;
  readonly #c: Client;
  readonly #sandboxId: string;
  readonly #response: Response;
  readonly #events: ExecEvent[] = [];

  constructor(client: Client, sandboxId: string, response: Response) {
    this.#c = client;
    this.#sandboxId = sandboxId;
    this.#response = response;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<ExecEvent> {
    const encoder = new TextEncoder();
    for await (const line of lines(this.#response.body)) {
      if (!line.trim()) continue;
      const raw = JSON.parse(line) as Json;
      const type = String(raw["type"] ?? "");
      let data = new Uint8Array();
      if (type === "stdout" || type === "stderr") {
        data = typeof raw["base64"] === "string"
          ? Uint8Array.from(atob(raw["base64"] as string), (c) => c.charCodeAt(0))
          : encoder.encode(String(raw["text"] ?? ""));
      }
      const event: ExecEvent = { type, data, raw };
      if (type === "started") this.execId = raw["exec_id"] as string;
      else if (type === "exit") this.result = this.#finish(raw);
      else this.#events.push(event);
      yield event;
    }
    if (!this.result) throw new SandgateError("exec_interrupted", "the output stream ended before the exit");
  }

  #finish(exit: Json): ExecResult {
    const join = (kind: string) => {
      const parts = this.#events.filter((e) => e.type === kind).map((e) => e.data);
      const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
      let at = 0;
      for (const p of parts) {
        out.set(p, at);
        at += p.length;
      }
      return out;
    };
    const stdoutBytes = join("stdout");
    const stderrBytes = join("stderr");
    const decoder = new TextDecoder();
    return {
      exitCode: (exit["code"] as number | null) ?? null,
      signal: (exit["signal"] as number | null) ?? null,
      reason: String(exit["reason"] ?? ""),
      stdout: decoder.decode(stdoutBytes),
      stderr: decoder.decode(stderrBytes),
      stdoutBytes,
      stderrBytes,
      execId: this.execId,
      events: [...this.#events],
    };
  }

  /** Kill the command's process tree (`POST .../exec/{exec_id}/cancel`). */
  async cancel(): Promise<void> {
    if (!this.execId) return;
    await this.#c.request("POST", `/v1/sandboxes/${seg(this.#sandboxId)}/exec/${seg(this.execId)}/cancel`);
  }

  async close(): Promise<void> {
    await this.#response.body?.cancel().catch(() => {});
  }
}

/** A sandbox's files (paths absolute, or relative to its home). */
export class Files {
  readonly #c: Client;
  readonly #base: string;
  constructor(client: Client, sandboxId: string) {
    this.#c = client;
    this.#base = `/v1/sandboxes/${seg(sandboxId)}/files`;
  }

  async read(path: string): Promise<Uint8Array> {
    const response = await this.#c.request("GET", `${this.#base}/content`, { params: { path } });
    return new Uint8Array(await response.arrayBuffer());
  }

  async readText(path: string): Promise<string> {
    return new TextDecoder().decode(await this.read(path));
  }

  async write(path: string, data: Uint8Array | string): Promise<void> {
    const body = typeof data === "string" ? new TextEncoder().encode(data) : data;
    await this.#c.request("PUT", `${this.#base}/content`, {
      params: { path },
      body,
      headers: { "content-type": "application/octet-stream" },
    });
  }

  async list(path: string): Promise<FileEntry[]> {
    const raw = await this.#c.json<FileList>("GET", this.#base, { params: { path } });
    return raw.entries;
  }

  async remove(path: string, options: { recursive?: boolean } = {}): Promise<void> {
    await this.#c.request("DELETE", this.#base, { params: { path, recursive: Boolean(options.recursive) } });
  }

  async mkdir(path: string, options: { parents?: boolean } = {}): Promise<void> {
    await this.#c.request("POST", `${this.#base}/mkdir`, { params: { path, parents: Boolean(options.parents) } });
  }
}

export class Routes {
  readonly #c: Client;
  constructor(client: Client) {
    this.#c = client;
  }
  /** Every pool with its unmet requirements, rank keys and bands, and the final `order`. */
  explain(request: CreateBody): Promise<Explanation> {
    return this.#c.json<Explanation>("POST", "/v1/routes:explain", { json: request });
  }
}

export class Pools {
  readonly #c: Client;
  constructor(client: Client) {
    this.#c = client;
  }
  async list(): Promise<PoolView[]> {
    return (await this.#c.json<PoolsView>("GET", "/v1/pools")).pools;
  }
}

export interface CredentialInput {
  secret: string;
  destinations: CredentialBody["destinations"];
  apply: CredentialBody["apply"];
  placeholderEnv?: string;
  user?: string;
  scrubResponseBody?: boolean;
  workspace?: string;
}

/** Workspace credentials: metadata only ever comes back; the secret goes in once. */
export class Credentials {
  readonly #c: Client;
  constructor(client: Client) {
    this.#c = client;
  }

  #path(workspace: string | undefined, name?: string): string {
    const base = `/v1/workspaces/${seg(this.#c.ws(workspace))}/credentials`;
    return name ? `${base}/${seg(name)}` : base;
  }

  async create(name: string, input: CredentialInput): Promise<Credential> {
    const body: CredentialBody = {
      name,
      secret: input.secret,
      destinations: input.destinations,
      apply: input.apply,
      scrub_response_body: input.scrubResponseBody ?? false,
    };
    if (input.placeholderEnv) body.placeholder_env = input.placeholderEnv;
    if (input.user) body.user = input.user;
    return credential(await this.#c.json<CredentialMetadata>("POST", this.#path(input.workspace), { json: body }));
  }

  /** Replace the secret, keeping destinations and how it is applied. */
  async rotate(name: string, options: { secret: string; workspace?: string }): Promise<Credential> {
    const current = await this.get(name, options);
    const body: CredentialBody = {
      secret: options.secret,
      destinations: current.destinations,
      apply: current.apply,
      scrub_response_body: Boolean(current.raw["scrub_response_body"]),
    };
    if (current.placeholder_env) body.placeholder_env = current.placeholder_env;
    if (current.user) body.user = current.user;
    return credential(await this.#c.json<CredentialMetadata>("PUT", this.#path(options.workspace, name), { json: body }));
  }

  async get(name: string, options: { workspace?: string } = {}): Promise<Credential> {
    return credential(await this.#c.json<CredentialView>("GET", this.#path(options.workspace, name)));
  }

  async list(options: { workspace?: string } = {}): Promise<Credential[]> {
    const raw = await this.#c.json<CredentialList>("GET", this.#path(options.workspace));
    return (raw.credentials ?? []).map(credential);
  }

  async delete(name: string, options: { workspace?: string } = {}): Promise<void> {
    await this.#c.request("DELETE", this.#path(options.workspace, name));
  }
}

export class Delegations {
  readonly #c: Client;
  constructor(client: Client) {
    this.#c = client;
  }

  async mint(
    sandboxId: string,
    actions: string[],
    options: { agent: string; until?: Date; ttlSecs?: number },
  ): Promise<Delegation> {
    if (options.until && options.ttlSecs !== undefined) throw new Error("pass until or ttlSecs, not both");
    const body: MintBody = { agent: options.agent, actions };
    if (options.until) body.ttl_secs = Math.max(1, Math.floor((options.until.getTime() - Date.now()) / 1000));
    else if (options.ttlSecs !== undefined) body.ttl_secs = options.ttlSecs;
    const raw = await this.#c.json<MintedDelegation>("POST", `/v1/sandboxes/${seg(sandboxId)}/delegations`, {
      json: body,
    });
    return new Delegation(raw.delegation, raw.token);
  }

  async list(sandboxId: string): Promise<Delegation[]> {
    const raw = await this.#c.json<DelegationList>("GET", `/v1/sandboxes/${seg(sandboxId)}/delegations`);
    return (raw.delegations ?? []).map((d) => new Delegation(d));
  }

  async revoke(delegationId: string): Promise<void> {
    await this.#c.request("DELETE", `/v1/delegations/${seg(delegationId)}`);
  }
}
