/**
 * Values the client returns, read from the answers the OpenAPI document types: each is
 * built from the generated type of its answer in `schema.ts` (`SandboxView`,
 * `AttemptRecord`, `DryRunPlan`, `CredentialView`, `DelegationView`; regenerated from
 * `GET /openapi.json` and checked against the served document in CI), its fields picked
 * from that type, so a field the gateway drops or renames fails to compile here. Explain
 * answers and pools are the generated types themselves. Each value keeps the answer it was
 * read from in `raw`.
 *
 * Secrets (a new sandbox's egress token, a delegation's token) live in private fields:
 * `console.log`, `util.inspect` and `JSON.stringify` never show them; read them from the
 * getters when you mean to.
 */

import type {
  AttemptRecord,
  CredentialMetadata,
  CredentialView,
  DelegationView,
  DryRunPlan,
  SandboxEntry,
  SandboxView,
} from "./schema.js";

export type { AttemptRecord } from "./schema.js";

export type Json = Record<string, unknown>;

/** A sandbox as `GET /v1/sandboxes/{id}` shows it (the generated `SandboxView`). */
export type SandboxInfo = Pick<
  SandboxView,
  "id" | "workspace" | "state" | "labels" | "attempts" | "error" | "created_ms" | "expires_ms"
> & {
  placement: ({ pool?: string } & Json) | null;
  raw: Json;
};

export function sandboxInfo(raw: SandboxView): SandboxInfo {
  return {
    id: raw.id,
    workspace: raw.workspace,
    state: raw.state,
    labels: raw.labels ?? {},
    placement: (raw.placement as SandboxInfo["placement"] | undefined) ?? null,
    attempts: raw.attempts ?? [],
    error: raw.error ?? null,
    created_ms: raw.created_ms,
    expires_ms: raw.expires_ms ?? null,
    raw: withoutToken(raw),
  };
}

/** `raw` without the egress token (kept in a private field instead). */
function withoutToken(raw: SandboxView): Json {
  const { token: _token, ...egress } = raw.egress ?? ({} as SandboxView["egress"]);
  return { ...raw, egress };
}

/** One server-sent event of a create; `id` is what `Last-Event-ID` resumes after. */
export interface CreateEvent {
  type: "state" | "attempt_started" | "attempt_ended" | "done" | string;
  id: string | undefined;
  data: Json;
}

/** One line of an exec's output: `started`, `stdout`, `stderr` or `exit`. */
export interface ExecEvent {
  type: "started" | "stdout" | "stderr" | "exit" | string;
  data: Uint8Array;
  raw: Json;
}

export interface ExecResult {
  /** null when a signal ended it. */
  exitCode: number | null;
  signal: number | null;
  /** `exited`, `timed_out` or `cancelled`. */
  reason: string;
  stdout: string;
  stderr: string;
  stdoutBytes: Uint8Array;
  stderrBytes: Uint8Array;
  execId: string | undefined;
  /** Every output event in the order the gateway sent them. */
  events: ExecEvent[];
}

/** One entry of `files.list`: the generated `SandboxEntry` (`kind` is `file`, `dir`, `symlink` or `other`). */
export type FileEntry = SandboxEntry;

/**
 * A workspace credential's metadata (the generated `CredentialView`; `version` only where
 * the answer has it); the secret never comes back.
 */
export type Credential = Pick<
  CredentialView,
  "workspace" | "name" | "destinations" | "apply" | "placeholder_env" | "user"
> &
  Partial<Pick<CredentialView, "version">> & { raw: Json };

export function credential(raw: CredentialView | CredentialMetadata): Credential {
  return {
    workspace: raw.workspace,
    name: raw.name,
    destinations: raw.destinations ?? [],
    apply: raw.apply,
    placeholder_env: raw.placeholder_env,
    user: raw.user,
    version: "version" in raw ? raw.version : undefined,
    raw: { ...raw },
  };
}

/**
 * A dry run's answer (the generated `DryRunPlan`): what a create of this body would do;
 * nothing was created.
 */
export type Plan = Pick<DryRunPlan, "would_create" | "first_pool" | "plan" | "refused" | "error"> & {
  raw: Json;
};

export function plan(raw: DryRunPlan): Plan {
  return {
    would_create: raw.would_create,
    first_pool: raw.first_pool ?? null,
    plan: raw.plan ?? [],
    refused: raw.refused ?? [],
    error: raw.error ?? null,
    raw: { ...raw },
  };
}

const inspect = Symbol.for("nodejs.util.inspect.custom");

/**
 * A delegated capability: `actions` on `sandboxId` until `expiresMs`. `token` is set only
 * on the mint's answer (the gateway shows it once).
 */
export class Delegation {
  readonly id: string;
  readonly sandboxId: string;
  readonly agent: string;
  readonly actions: string[];
  readonly expiresMs: number;
  readonly revokedMs: number | null;
  readonly raw: DelegationView;
  #token: string | undefined;

  constructor(raw: DelegationView, token?: string) {
    this.id = raw.id;
    this.sandboxId = raw.sandbox_id;
    this.agent = raw.agent;
    this.actions = raw.actions ?? [];
    this.expiresMs = raw.expires_ms;
    this.revokedMs = raw.revoked_ms ?? null;
    this.raw = raw;
    this.#token = token;
  }

  get token(): string | undefined {
    return this.#token;
  }

  toJSON(): DelegationView {
    return this.raw;
  }

  [inspect](): string {
    return `Delegation { id: '${this.id}', sandboxId: '${this.sandboxId}', actions: ${JSON.stringify(this.actions)} }`;
  }
}
