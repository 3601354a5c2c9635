"""Errors raised by the sandgate SDK, one class per family of the API's stable error codes.

Contract (mirrors ``src/error.rs`` and ``src/reply.rs`` in the gateway):

- Every ``/v1`` failure answers ``{"error": {"code", "message", "details"}}`` with the code
  also in ``X-Sandgate-Error``; a retry with a known delay adds ``Retry-After``.
- ``code`` is stable; :func:`error_from_response` picks the class by code first and falls
  back to the HTTP status (a 403 naming a policy ``layer`` in its details is ``PolicyDenied``
  whatever its code), so a code this SDK does not know yet still lands in the right
  family (and ``SandgateError`` when the status is unknown too).
- ``details`` is kept as the server sent it (a dict); the typed attributes some classes add
  (``layer``, ``reasons``, ``attempts``, ``retry_after``) are read from it.
- Nothing here ever holds a secret: the server never puts one in an error, and the SDK only
  copies the error body and the request id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Type


class SandgateError(Exception):
    """A failure the gateway answered (or the SDK could not reach it: ``status`` is None)."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: Optional[int] = None,
        details: Optional[Mapping[str, Any]] = None,
        request_id: Optional[str] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.details: Dict[str, Any] = dict(details or {})
        self.request_id = request_id
        self.retry_after = retry_after

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, status={self.status!r}, "
            f"message={self.message!r}, request_id={self.request_id!r})"
        )


class InvalidRequest(SandgateError):
    """400: input that cannot be taken as it is; ``field`` names where."""

    @property
    def field(self) -> Optional[str]:
        value = self.details.get("field")
        return value if isinstance(value, str) else None


class Unauthenticated(SandgateError):
    """401: no valid API key or delegated token."""


class PermissionDenied(SandgateError):
    """403 that is not a policy decision: scope, ownership, a delegation's limits."""


class PolicyDenied(PermissionDenied):
    """403 from a policy layer; ``layer`` and ``reasons`` say which and why."""

    @property
    def layer(self) -> Optional[str]:
        value = self.details.get("layer")
        return value if isinstance(value, str) else None

    @property
    def reasons(self) -> List[str]:
        value = self.details.get("reasons")
        return [r for r in value if isinstance(r, str)] if isinstance(value, list) else []


class NotFound(SandgateError):
    """404: no such thing, or not visible to this caller."""


class Conflict(SandgateError):
    """409: the thing's current state does not allow the operation."""


class IdempotencyConflict(Conflict):
    """409: the Idempotency-Key was used before with a different body."""


class Gone(SandgateError):
    """410: the thing existed and is gone for good.

    The status family's fallback: ``/v1`` answers no 410 today. A sandbox whose instance its
    provider ended is marked ``failed`` (``instance_lost`` in ``info.error``), and an
    operation on it raises :class:`Conflict` (409 ``sandbox_state``)."""


class PayloadTooLarge(SandgateError):
    """413: a body over its limit (``details.limit``)."""


@dataclass(frozen=True)
class Attempt:
    """A pool the router ruled out, and the request's fields it could not meet."""

    pool: str
    provider: str
    unmet_requirements: List[str] = field(default_factory=list)


class NoEligibleProvider(SandgateError):
    """422: no pool can serve the request; ``attempts`` says why each was ruled out."""

    @property
    def attempts(self) -> List[Attempt]:
        raw = self.details.get("attempts")
        if not isinstance(raw, list):
            return []
        return [_attempt(a) for a in raw if isinstance(a, dict)]


class RateLimited(SandgateError):
    """429: the caller's share is used up; ``retry_after`` seconds when the server said."""


class Unavailable(SandgateError):
    """503: the gateway cannot serve now (overloaded, not ready, store down, no pool placed)."""


class UpstreamError(SandgateError):
    """502/504: a provider, origin or resolver past sandgate failed (``provider_error``) or
    did not answer in time (``upstream_timeout``)."""


class Unsupported(SandgateError):
    """501: the operation is not offered by this gateway or provider."""


class InternalError(SandgateError):
    """500: sandgate failed; the cause is in its log, under the request id."""


def _attempt(raw: Mapping[str, Any]) -> Attempt:
    unmet = raw.get("unmet_requirements")
    return Attempt(
        pool=str(raw.get("pool", "")),
        provider=str(raw.get("provider", "")),
        unmet_requirements=[u for u in unmet if isinstance(u, str)] if isinstance(unmet, list) else [],
    )


# Codes whose family is not the one their status alone would give.
_BY_CODE: Dict[str, Type[SandgateError]] = {
    "policy_denied": PolicyDenied,
    "egress_denied": PolicyDenied,
    "credential_denied": PolicyDenied,
    "billing_refused": PolicyDenied,
    "idempotency_conflict": IdempotencyConflict,
    "no_eligible_provider": NoEligibleProvider,
    "no_eligible_pool": NoEligibleProvider,
}

_BY_STATUS: Dict[int, Type[SandgateError]] = {
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
}

# A Retry-After longer than this is not slept on by the SDK: the caller decides.
MAX_RETRY_AFTER_SECONDS = 300.0


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    """Seconds from a ``Retry-After`` header; None when absent, malformed or a date."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    if seconds != seconds or seconds < 0:  # NaN or negative: not a delay
        return None
    return min(seconds, MAX_RETRY_AFTER_SECONDS)


def error_from_response(
    status: int,
    body: Any,
    headers: Mapping[str, str],
) -> SandgateError:
    """The error for an answer with ``status``, decoded JSON ``body`` and ``headers``.

    ``headers`` must look up names case-insensitively (httpx and fetch headers do).
    A body that is not the error shape still gives an error: the code from
    ``X-Sandgate-Error`` or ``http_<status>``, the message ``HTTP <status>``.
    """
    inner = body.get("error") if isinstance(body, dict) else None
    inner = inner if isinstance(inner, dict) else {}
    code = inner.get("code")
    if not isinstance(code, str) or not code:
        code = headers.get("x-sandgate-error") or f"http_{status}"
    message = inner.get("message")
    if not isinstance(message, str):
        message = f"HTTP {status}"
    details = inner.get("details")
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status, SandgateError)
    if cls is PermissionDenied and isinstance(details, dict) and isinstance(details.get("layer"), str):
        # A policy layer's refusal under another code (the creation layer's `forbidden`).
        cls = PolicyDenied
    return cls(
        code,
        message,
        status=status,
        details=details if isinstance(details, dict) else None,
        request_id=headers.get("x-request-id"),
        retry_after=parse_retry_after(headers.get("retry-after")),
    )


__all__ = [
    "Attempt",
    "Conflict",
    "Gone",
    "IdempotencyConflict",
    "InternalError",
    "InvalidRequest",
    "NoEligibleProvider",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "PolicyDenied",
    "RateLimited",
    "SandgateError",
    "Unauthenticated",
    "Unavailable",
    "Unsupported",
    "UpstreamError",
    "error_from_response",
    "parse_retry_after",
]
