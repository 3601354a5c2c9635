"""When the SDK sends a request again, and after how long.

Contract: a request is retried only when sending it twice cannot do a thing twice, and only
on an answer that says a retry can help:

- the method is idempotent (GET, HEAD, OPTIONS, PUT, DELETE), or it is a create carrying an
  ``Idempotency-Key`` (the gateway replays the first answer for the same key and body);
- the answer is 429 (``RateLimited``) or 503 (``Unavailable``): the kinds the gateway marks
  retryable without the request having reached a provider;
- never an answer that is a create's stored outcome: an error naming the sandbox the create
  made (``details.sandbox_id``, e.g. 503 ``creation_failed`` after every candidate failed) is
  what the gateway keeps under the ``Idempotency-Key`` and answers every resend of it with;
  sending it again can only get the same failure back;
- at most ``max_attempts`` sends in all; the wait is the server's ``Retry-After`` when it
  gave one (already capped by :func:`sandgate.errors.parse_retry_after`), otherwise
  exponential backoff from ``base_delay`` capped at ``max_delay``, with full jitter so many
  clients do not come back together.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Optional

from .errors import RateLimited, SandgateError, Unavailable

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


@dataclass(frozen=True)
class RetryPolicy:
    """How many times and how long to wait; ``RetryPolicy(max_attempts=1)`` never retries."""

    max_attempts: int = 3
    base_delay: float = 0.5
    max_delay: float = 8.0

    def delay(
        self,
        attempt: int,
        method: str,
        error: SandgateError,
        *,
        idempotency_key: Optional[str] = None,
        rand: Callable[[], float] = random.random,
    ) -> Optional[float]:
        """Seconds to wait before send number ``attempt + 1``, or None to raise ``error``.

        ``attempt`` counts sends made so far, starting at 1.
        """
        if attempt >= self.max_attempts:
            return None
        if not isinstance(error, (RateLimited, Unavailable)):
            return None
        if not is_replay_safe(method, idempotency_key):
            return None
        if is_stored_outcome(error):
            return None
        if error.retry_after is not None:
            return error.retry_after
        ceiling = min(self.max_delay, self.base_delay * (2.0 ** (attempt - 1)))
        return ceiling * rand()


def is_replay_safe(method: str, idempotency_key: Optional[str]) -> bool:
    """Whether sending this request twice has the effect of sending it once."""
    return method.upper() in IDEMPOTENT_METHODS or bool(idempotency_key)


def is_stored_outcome(error: SandgateError) -> bool:
    """Whether ``error`` is the stored end of a create (it names the sandbox the create made):
    a resend under the same ``Idempotency-Key`` replays it rather than trying again."""
    return bool(error.details.get("sandbox_id"))


__all__ = ["IDEMPOTENT_METHODS", "RetryPolicy", "is_replay_safe", "is_stored_outcome"]
