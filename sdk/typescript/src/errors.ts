/**
 * Errors thrown by the sandgate SDK, one class per family of the API's stable error codes.
 *
 * Contract (mirrors `src/error.rs` and `src/reply.rs` in the gateway, and the Python SDK's
 * `sandgate.errors`):
 * - Every `/v1` failure answers `{"error": {"code", "message", "details"}}`, the code also
 *   in `X-Sandgate-Error`; a retry with a known delay adds `Retry-After`.
 * - The class is picked by code first, then by HTTP status, so a code this SDK does not
 *   know yet still lands in its family (`SandgateError` when the status is unknown too); a
 *   403 naming a policy `layer` in its details is `PolicyDenied` whatever its code.
 * - Nothing here ever holds a secret: the server never puts one in an error.
 */

export type Details = Record<string, unknown>;

export interface ErrorInit {
  status?: number;
  details?: Details;
  requestId?: string;
  retryAfter?: number;
}

export class SandgateError extends Error {
  readonly code: string;
  readonly status: number | undefined;
  readonly details: Details;
  readonly requestId: string | undefined;
  /** Seconds the server asked to wait, capped at {@link MAX_RETRY_AFTER_SECONDS}. */
  readonly retryAfter: number | undefined;

  constructor(code: string, message: string, init: ErrorInit = {}) {
    super(`${code}: ${message}`);
    this.name = new.target.name;
    this.code = code;
    this.status = init.status;
    this.details = init.details ?? {};
    this.requestId = init.requestId;
    this.retryAfter = init.retryAfter;
  }
}

/** 400/422: input that cannot be taken as it is; `field` names where. */
export class InvalidRequest extends SandgateError {
  get field(): string | undefined {
    const f = this.details["field"];
    return typeof f === "string" ? f : undefined;
  }
}
/** 401: no valid API key or delegated token. */
export class Unauthenticated extends SandgateError {}
/** 403 that is not a policy decision: scope, ownership, a delegation's limits. */
export class PermissionDenied extends SandgateError {}
/** 403 from a policy layer; `layer` and `reasons` say which and why. */
export class PolicyDenied extends PermissionDenied {
  get layer(): string | undefined {
    const l = this.details["layer"];
    return typeof l === "string" ? l : undefined;
  }
  get reasons(): string[] {
    const r = this.details["reasons"];
    return Array.isArray(r) ? r.filter((x): x is string => typeof x === "string") : [];
  }
}
/** 404: no such thing, or not visible to this caller. */
export class NotFound extends SandgateError {}
/** 409: the thing's current state does not allow the operation. */
export class Conflict extends SandgateError {}
/** 409: the Idempotency-Key was used before with a different body. */
export class IdempotencyConflict extends Conflict {}
/**
 * 410: gone for good. The status family's fallback: `/v1` answers no 410 today. A sandbox
 * whose instance its provider ended is marked `failed` (`instance_lost` in its `error`), and
 * an operation on it throws `Conflict` (409 `sandbox_state`).
 */
export class Gone extends SandgateError {}
/** 413: a body over its limit (`details.limit`). */
export class PayloadTooLarge extends SandgateError {}

/** A pool the router ruled out, and the request's fields it could not meet. */
export interface Attempt {
  pool: string;
  provider: string;
  unmet_requirements: string[];
}

/** 422: no pool can serve the request; `attempts` says why each was ruled out. */
export class NoEligibleProvider extends SandgateError {
  get attempts(): Attempt[] {
    const raw = this.details["attempts"];
    if (!Array.isArray(raw)) return [];
    return raw.filter(isObject).map(toAttempt);
  }
}
/** 429: the caller's share is used up. */
export class RateLimited extends SandgateError {}
/** 503: the gateway cannot serve now. */
export class Unavailable extends SandgateError {}
/**
 * 502/504: a provider, origin or resolver past sandgate failed (`provider_error`) or did not
 * answer in time (`upstream_timeout`).
 */
export class UpstreamError extends SandgateError {}
/** 501: not offered by this gateway or provider. */
export class Unsupported extends SandgateError {}
/** 500: sandgate failed; the cause is in its log, under the request id. */
export class InternalError extends SandgateError {}

type ErrorClass = new (code: string, message: string, init?: ErrorInit) => SandgateError;

// Codes whose family is not the one their status alone would give.
const BY_CODE: Record<string, ErrorClass> = {
  policy_denied: PolicyDenied,
  egress_denied: PolicyDenied,
  credential_denied: PolicyDenied,
  billing_refused: PolicyDenied,
  idempotency_conflict: IdempotencyConflict,
  no_eligible_provider: NoEligibleProvider,
  no_eligible_pool: NoEligibleProvider,
};

const BY_STATUS: Record<number, ErrorClass> = {
  400: InvalidRequest,
  401: Unauthenticated,
  403: PermissionDenied,
  404: NotFound,
  409: Conflict,
  410: Gone,
  413: PayloadTooLarge,
  422: InvalidRequest,
  429: RateLimited,
  500: InternalError,
  501: Unsupported,
  502: UpstreamError,
  503: Unavailable,
  504: UpstreamError,
};

/** A Retry-After longer than this is not slept on by the SDK: the caller decides. */
export const MAX_RETRY_AFTER_SECONDS = 300;

/** Seconds from a `Retry-After` header; undefined when absent, malformed or a date. */
export function parseRetryAfter(value: string | null | undefined): number | undefined {
  if (value == null || value.trim() === "") return undefined;
  const seconds = Number(value.trim());
  if (!Number.isFinite(seconds) || seconds < 0) return undefined;
  return Math.min(seconds, MAX_RETRY_AFTER_SECONDS);
}

/** The error for an answer with `status`, decoded JSON `body` (or anything) and `headers`. */
export function errorFromResponse(status: number, body: unknown, headers: Headers): SandgateError {
  const inner = isObject(body) && isObject(body["error"]) ? body["error"] : {};
  const rawCode = inner["code"];
  const code =
    typeof rawCode === "string" && rawCode !== ""
      ? rawCode
      : (headers.get("x-sandgate-error") ?? `http_${status}`);
  const message = typeof inner["message"] === "string" ? inner["message"] : `HTTP ${status}`;
  const details = isObject(inner["details"]) ? inner["details"] : {};
  let cls = BY_CODE[code] ?? BY_STATUS[status] ?? SandgateError;
  if (cls === PermissionDenied && typeof details["layer"] === "string") {
    // A policy layer's refusal under another code (the creation layer's `forbidden`).
    cls = PolicyDenied;
  }
  return new cls(code, message, {
    status,
    details,
    requestId: headers.get("x-request-id") ?? undefined,
    retryAfter: parseRetryAfter(headers.get("retry-after")),
  });
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function toAttempt(raw: Record<string, unknown>): Attempt {
  const unmet = raw["unmet_requirements"];
  return {
    pool: String(raw["pool"] ?? ""),
    provider: String(raw["provider"] ?? ""),
    unmet_requirements: Array.isArray(unmet)
      ? unmet.filter((u): u is string => typeof u === "string")
      : [],
  };
}
