/**
 * When the SDK sends a request again, and after how long.
 *
 * Contract (same as the Python SDK's `sandgate.retry`): retry only when sending twice
 * cannot do a thing twice (an idempotent method, or a create with an `Idempotency-Key`),
 * only on 429 (`RateLimited`) or 503 (`Unavailable`), at most `maxAttempts` sends in all;
 * wait the server's `Retry-After` when given, otherwise exponential backoff from `baseDelay`
 * capped at `maxDelay`, with full jitter so many clients do not come back together.
 * Never an answer that is a create's stored outcome: an error naming the sandbox the create
 * made (`details.sandbox_id`, e.g. 503 `creation_failed` after every candidate failed) is
 * what the gateway keeps under the `Idempotency-Key` and replays to every resend.
 */

import { RateLimited, SandgateError, Unavailable } from "./errors.js";

export const IDEMPOTENT_METHODS: ReadonlySet<string> = new Set([
  "GET",
  "HEAD",
  "OPTIONS",
  "PUT",
  "DELETE",
]);

export interface RetryOptions {
  maxAttempts?: number;
  /** Seconds. */
  baseDelay?: number;
  /** Seconds. */
  maxDelay?: number;
}

export class RetryPolicy {
  readonly maxAttempts: number;
  readonly baseDelay: number;
  readonly maxDelay: number;

  constructor(options: RetryOptions = {}) {
    this.maxAttempts = options.maxAttempts ?? 3;
    this.baseDelay = options.baseDelay ?? 0.5;
    this.maxDelay = options.maxDelay ?? 8;
  }

  /**
   * Seconds to wait before send number `attempt + 1`, or undefined to throw `error`.
   * `attempt` counts sends made so far, starting at 1.
   */
  delay(
    attempt: number,
    method: string,
    error: SandgateError,
    idempotencyKey?: string,
    rand: () => number = Math.random,
  ): number | undefined {
    if (attempt >= this.maxAttempts) return undefined;
    if (!(error instanceof RateLimited || error instanceof Unavailable)) return undefined;
    if (!isReplaySafe(method, idempotencyKey)) return undefined;
    if (isStoredOutcome(error)) return undefined;
    if (error.retryAfter !== undefined) return error.retryAfter;
    const ceiling = Math.min(this.maxDelay, this.baseDelay * 2 ** (attempt - 1));
    return ceiling * rand();
  }
}

/** Whether sending this request twice has the effect of sending it once. */
export function isReplaySafe(method: string, idempotencyKey?: string): boolean {
  return IDEMPOTENT_METHODS.has(method.toUpperCase()) || Boolean(idempotencyKey);
}

/**
 * Whether `error` is the stored end of a create (it names the sandbox the create made): a
 * resend under the same `Idempotency-Key` replays it rather than trying again.
 */
export function isStoredOutcome(error: SandgateError): boolean {
  return Boolean(error.details["sandbox_id"]);
}
