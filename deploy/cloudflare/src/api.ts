// The bridge's HTTP contract: every request and response body sandgate's Cloudflare adapter
// sends or reads. This file is the contract: the bridge (index.ts) is typechecked against it,
// and so are the fake bridge's real answers (test/fake-samples.ts), so a field renamed here fails
// both until they agree. Types only.

// Every request carries `Authorization: Bearer <SANDGATE_BRIDGE_TOKEN>`; see README.

/**
 * The container's outbound network, in the SDK's own words (`Container.enableInternet`,
 * `Container.setAllowedHosts`). Locked to the gateway means `enableInternet: false` and
 * `allowedHosts` naming only the gateway's proxy host.
 */
export interface Outbound {
  enableInternet: boolean;
  allowedHosts: string[];
}

/** `POST /v1/sandbox`. */
export interface CreateSandboxRequest {
  /**
   * The sandbox's name, which is its Durable Object name: creating a name that exists answers
   * the existing sandbox (200) instead of a second one (201), so a retried create is not a
   * duplicate. Lowercase letters, digits and `-`, 1..63 characters.
   */
  id: string;
  /** Stored with the sandbox and set as the container's labels; listed by `GET /v1/sandbox?label=`. */
  labels: Record<string, string>;
  /** Container-level environment (`Sandbox.setEnvVars`); values are never echoed back. */
  env: Record<string, string>;
  outbound: Outbound;
  /** `SandboxOptions.sleepAfter`, seconds; the SDK's default when absent. */
  sleepAfterSeconds?: number;
}

export type SandboxState = "running" | "stopped" | "creating" | "failed";

/** One sandbox, as `POST`, `GET /v1/sandbox/:id` and the listing answer it. */
export interface SandboxInfo {
  id: string;
  state: SandboxState;
  labels: Record<string, string>;
  /** The names of the environment variables set at create; never their values. */
  envKeys: string[];
  /** The outbound settings applied to the container (the lock-down, when locked). */
  outbound: Outbound;
  /** RFC 3339. */
  createdAt: string;
}

/** `GET /v1/sandbox?label=key=value[&label=...]`: every sandbox carrying all the labels. */
export interface ListSandboxesResponse {
  sandboxes: SandboxInfo[];
}

/** `POST /v1/sandbox/:id/exec`; the answer is `text/event-stream` of [`ExecStreamEvent`]. */
export interface ExecRequest {
  command: string;
  cwd?: string;
  env?: Record<string, string>;
  /** Milliseconds; the SDK's default when absent. */
  timeoutMs?: number;
}

/**
 * One server-sent event of an exec: `event: <type>` and `data: <JSON of this object>`. Output
 * events come in the order the process wrote them; exactly one `exit` or `error` ends the stream.
 */
export type ExecStreamEvent =
  | { type: "stdout"; data: string }
  | { type: "stderr"; data: string }
  | { type: "exit"; exitCode: number }
  | { type: "error"; message: string };

/**
 * Files: `GET /v1/sandbox/:id/file/<absolute path without its leading slash>` answers the raw
 * bytes (`application/octet-stream`), 404 `file_not_found` when absent; `PUT` of the same path
 * with the raw bytes as body writes it and answers 204.
 */
export type FileBody = Uint8Array;

/** `DELETE /v1/sandbox/:id` answers 204 whether or not the sandbox existed. */
export type DeleteResponse = null;

/** The error codes, each with its one HTTP status (see README's table). */
export type ErrorCode =
  | "unauthorized" // 401
  | "invalid_request" // 400
  | "not_found" // 404: the sandbox
  | "file_not_found" // 404: a file in a sandbox that exists
  | "conflict" // 409: the id exists with different labels
  | "capacity" // 503: Cloudflare could not place the container
  | "rate_limited" // 429, with Retry-After
  | "internal"; // 500

/** Every non-2xx answer's body. */
export interface ErrorResponse {
  error: { code: ErrorCode; message: string };
}
