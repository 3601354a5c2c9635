"""Unit tests for the error mapping and the retry rule (no gateway needed).

The bodies here are the shape ``src/reply.rs`` renders; the scenarios against a real
gateway are still to come (see the issue's Tests section).
"""

from __future__ import annotations

import pytest

import sandgate
from sandgate.errors import error_from_response, parse_retry_after
from sandgate.retry import RetryPolicy


class Headers(dict):
    """Case-insensitive lookups, like httpx.Headers."""

    def get(self, key, default=None):  # type: ignore[override]
        for k, v in self.items():
            if k.lower() == key.lower():
                return v
        return default


def body(code, message="m", **details):
    return {"error": {"code": code, "message": message, "details": details}}


@pytest.mark.parametrize(
    "status,code,cls",
    [
        (403, "policy_denied", sandgate.PolicyDenied),
        (403, "egress_denied", sandgate.PolicyDenied),
        (403, "delegation_scope", sandgate.PermissionDenied),
        (409, "idempotency_conflict", sandgate.IdempotencyConflict),
        (409, "already_exists", sandgate.Conflict),
        (422, "no_eligible_provider", sandgate.NoEligibleProvider),
        (404, "not_found", sandgate.NotFound),
        (429, "rate_limited", sandgate.RateLimited),
        (503, "store_unavailable", sandgate.Unavailable),
        (503, "overloaded", sandgate.Unavailable),
        (400, "invalid_request", sandgate.InvalidRequest),
        (401, "unauthenticated", sandgate.Unauthenticated),
        (410, "instance_lost", sandgate.Gone),
        (502, "upstream_failed", sandgate.UpstreamError),
        (504, "upstream_timeout", sandgate.UpstreamError),
        (500, "internal", sandgate.InternalError),
        (501, "unsupported", sandgate.Unsupported),
        (418, "teapot", sandgate.SandgateError),
    ],
)
def test_class_by_code_then_status(status, code, cls):
    err = error_from_response(status, body(code), Headers())
    assert type(err) is cls
    assert err.code == code and err.status == status and err.message == "m"


def test_unknown_code_falls_back_to_status_family():
    err = error_from_response(409, body("some_future_conflict"), Headers())
    assert type(err) is sandgate.Conflict


def test_policy_denied_carries_layer_and_reasons():
    err = error_from_response(
        403, body("policy_denied", layer="creation", reasons=["no gpu", 7]), Headers()
    )
    assert isinstance(err, sandgate.PolicyDenied)
    assert err.layer == "creation"
    assert err.reasons == ["no gpu"]  # non-strings dropped, not raised on


def test_a_403_naming_a_policy_layer_is_a_policy_denial_whatever_its_code():
    # The creation layer's refusal is `forbidden` with the layer and reasons in details.
    err = error_from_response(
        403, body("forbidden", layer="sandgate.creation", reasons=["tier"]), Headers()
    )
    assert type(err) is sandgate.PolicyDenied and err.layer == "sandgate.creation"


def test_no_eligible_provider_attempts():
    attempts = [
        {"pool": "a", "provider": "local", "unmet_requirements": ["regions"]},
        {"pool": "b", "provider": "e2b", "unmet_requirements": ["features.isolation"]},
        "junk",
    ]
    err = error_from_response(422, body("no_eligible_provider", attempts=attempts), Headers())
    assert [(a.pool, a.unmet_requirements) for a in err.attempts] == [
        ("a", ["regions"]),
        ("b", ["features.isolation"]),
    ]


def test_request_id_and_retry_after_from_headers():
    headers = Headers({"X-Request-Id": "req-1", "Retry-After": "3"})
    err = error_from_response(429, body("rate_limited"), headers)
    assert err.request_id == "req-1"
    assert err.retry_after == 3.0
    assert "req-1" in repr(err)


@pytest.mark.parametrize("payload", [None, "text", [], {"error": "x"}, {"error": {"code": 5}}])
def test_malformed_bodies_still_give_an_error(payload):
    err = error_from_response(503, payload, Headers({"X-Sandgate-Error": "overloaded"}))
    assert isinstance(err, sandgate.Unavailable)
    assert err.code == "overloaded"
    assert err.message == "HTTP 503"
    assert err.details == {}


def test_no_code_anywhere_names_the_status():
    err = error_from_response(502, None, Headers())
    assert err.code == "http_502"


@pytest.mark.parametrize(
    "raw,expected",
    [(None, None), ("2", 2.0), (" 1.5 ", 1.5), ("-1", None), ("nan", None),
     ("Wed, 21 Oct 2026 07:28:00 GMT", None), ("99999", 300.0)],
)
def test_parse_retry_after(raw, expected):
    assert parse_retry_after(raw) == expected


def limited(retry_after=None):
    return sandgate.RateLimited("rate_limited", "m", status=429, retry_after=retry_after)


def test_retry_only_when_replay_is_safe():
    policy = RetryPolicy()
    assert policy.delay(1, "GET", limited(2.0)) == 2.0
    assert policy.delay(1, "POST", limited(2.0)) is None
    assert policy.delay(1, "POST", limited(2.0), idempotency_key="k") == 2.0


def test_retry_only_on_retryable_families():
    policy = RetryPolicy()
    conflict = sandgate.Conflict("already_exists", "m", status=409)
    bad = sandgate.InvalidRequest("invalid_request", "m", status=400)
    unavailable = sandgate.Unavailable("overloaded", "m", status=503)
    assert policy.delay(1, "GET", conflict) is None
    assert policy.delay(1, "GET", bad) is None
    assert policy.delay(1, "GET", unavailable, rand=lambda: 1.0) == 0.5


def test_backoff_grows_and_stops():
    policy = RetryPolicy(max_attempts=4, base_delay=1.0, max_delay=3.0)
    waits = [policy.delay(n, "GET", limited(), rand=lambda: 1.0) for n in (1, 2, 3, 4)]
    assert waits == [1.0, 2.0, 3.0, None]
    assert RetryPolicy(max_attempts=1).delay(1, "GET", limited(1.0)) is None
