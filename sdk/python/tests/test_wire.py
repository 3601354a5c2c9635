"""Unit tests of what the clients parse and hide, without a gateway (the scenario suite in
sdk/python/scenarios runs the same code against a real one)."""

from __future__ import annotations

import sandgate
from sandgate import _wire
from sandgate.models import Delegation, SandboxInfo


def test_sse_parser_reads_events_skips_comments_and_joins_data_lines():
    parser = _wire.SseParser()
    lines = [
        ": keep-alive",
        "event: attempt_started",
        "id: 7",
        'data: {"pool": "a",',
        'data: "seq": 1}',
        "",
        "",
        "event: done",
        "id:8",
        'data:{"state": "running"}',
        "",
    ]
    events = [e for e in map(parser.feed, lines) if e is not None]
    assert [(e.type, e.id) for e in events] == [("attempt_started", "7"), ("done", "8")]
    assert events[0].data == {"pool": "a", "seq": 1} and events[0].attempt.pool == "a"
    assert events[1].data == {"state": "running"} and events[1].attempt is None


def test_exec_lines_decode_text_and_base64_chunks():
    assert _wire.exec_event('{"type":"stdout","text":"hi\\n"}').data == b"hi\n"
    assert _wire.exec_event('{"type":"stderr","base64":"//4="}').data == b"\xff\xfe"
    started = _wire.exec_event('{"type":"started","exec_id":"ex-1"}')
    assert started.type == "started" and started.raw["exec_id"] == "ex-1"
    assert _wire.exec_event("  ") is None


def test_a_command_string_runs_with_a_shell_and_a_list_is_the_argv():
    assert _wire.exec_body("echo hi", None, None, 1.5) == {
        "argv": ["sh", "-c", "echo hi"],
        "timeout_ms": 1500,
    }
    assert _wire.exec_body(["ls", "-l"], {"A": "1"}, "/tmp", None) == {
        "argv": ["ls", "-l"],
        "env": {"A": "1"},
        "cwd": "/tmp",
    }


def test_a_failed_create_raises_what_the_create_would_have_answered():
    refused = {"state": "failed", "error": {"error": {"code": "policy_denied", "message": "no",
                                                      "details": {"layer": "creation"}}}}
    err = _wire.failed_create_error(refused, "req-1")
    assert isinstance(err, sandgate.PolicyDenied) and err.status == 403
    assert err.request_id == "req-1" and err.layer == "creation"
    failed = _wire.failed_create_error({"state": "failed", "error": None}, None)
    assert isinstance(failed, sandgate.Unavailable) and failed.code == "creation_failed"


def test_secrets_stay_out_of_repr_and_raw():
    token = "sgp_secret_egress_token"
    raw = {"id": "sb-1", "state": "running", "egress": {"token": token, "proxy": "p"}}
    info = SandboxInfo(**SandboxInfo.fields_from(raw))
    assert info.egress_token == token
    assert token not in repr(info) and token not in repr(info.raw)
    d = Delegation.from_json({"id": "dg-1", "sandbox_id": "sb-1", "actions": ["exec"]}, token="sgd_x")
    assert d.token == "sgd_x" and "sgd_x" not in repr(d)
    assert "s3cret" not in repr(sandgate.Secret("s3cret"))
    client = sandgate.Client("http://127.0.0.1:1", "tok-should-not-show")
    assert "tok-should-not-show" not in repr(client)
    client.close()


def _sse(*events):
    return "".join(f"event: {t}\nid: {i}\ndata: {d}\n\n" for t, i, d in events)


def test_a_stream_that_ends_before_done_is_resumed_with_last_event_id():
    import httpx

    answers = [
        ": keep-alive\n\n" + _sse(("state", "1", '{"state": "provisioning"}'), ("attempt_started", "2", '{"pool": "a"}')),
        _sse(("attempt_ended", "3", '{"pool": "a"}'), ("done", "4", '{"state": "running"}')),
    ]
    seen_headers = []

    def handler(request):
        seen_headers.append(request.headers.get("last-event-id"))
        return httpx.Response(200, text=answers.pop(0), headers={"content-type": "text/event-stream"})

    with sandgate.Client("http://gw", "t", http=httpx.Client(transport=httpx.MockTransport(handler))) as c:
        events = [(e.type, e.id) for e in c.sandboxes.events("sb-1")]
    assert events == [("state", "1"), ("attempt_started", "2"), ("attempt_ended", "3"), ("done", "4")]
    assert seen_headers == [None, "2"]


def test_only_replay_safe_requests_are_sent_again():
    import httpx

    calls = []

    def handler(request):
        calls.append((request.method, request.headers.get("idempotency-key")))
        body = {"error": {"code": "overloaded", "message": "busy", "details": {}}}
        return httpx.Response(503, json=body, headers={"retry-after": "0"})

    policy = sandgate.RetryPolicy(max_attempts=3)
    with sandgate.Client("http://gw", "t", retry=policy, http=httpx.Client(transport=httpx.MockTransport(handler))) as c:
        for call in (
            lambda: c.sandboxes.create({}),  # POST without a key: once
            lambda: c.sandboxes.create({}, idempotency_key="k"),  # with a key: up to 3
            lambda: c.pools.list(),  # GET: up to 3
        ):
            try:
                call()
            except sandgate.Unavailable:
                pass
    assert calls == [("POST", None)] + [("POST", "k")] * 3 + [("GET", None)] * 3


def test_a_stored_create_failure_is_not_sent_again():
    """503 creation_failed names the sandbox the keyed create made: a resend would replay it."""
    import httpx

    calls = []

    def handler(request):
        calls.append(request.headers.get("idempotency-key"))
        details = {"sandbox_id": "sb-1", "attempts": []}
        body = {"error": {"code": "creation_failed", "message": "every candidate failed", "details": details}}
        return httpx.Response(503, json=body, headers={"retry-after": "0"})

    policy = sandgate.RetryPolicy(max_attempts=3)
    with sandgate.Client("http://gw", "t", retry=policy, http=httpx.Client(transport=httpx.MockTransport(handler))) as c:
        try:
            c.sandboxes.create({}, idempotency_key="k")
            raise AssertionError("the create did not fail")
        except sandgate.Unavailable as e:
            assert e.code == "creation_failed" and e.details["sandbox_id"] == "sb-1"
    assert calls == ["k"]


def test_both_clients_build_requests_from_the_same_shared_pieces():
    headers = _wire.request_headers("tok", {"x-a": "1"}, "key-1")
    assert headers["authorization"] == "Bearer tok" and headers["idempotency-key"] == "key-1"
    assert headers["x-a"] == "1" and "idempotency-key" not in _wire.request_headers("tok")
    assert _wire.sandbox_path("a/b", "/exec") == "/v1/sandboxes/a%2Fb/exec"
    assert _wire.credentials_path("ws a", "n") == "/v1/workspaces/ws%20a/credentials/n"
    assert _wire.list_params("running", {"suite": "py"}, None, 5) == {
        "limit": 5,
        "state": "running",
        "label": "suite=py",
    }
    params = {"limit": 1}
    assert _wire.next_page({"sandboxes": [{"id": "sb-1"}], "next_cursor": "c2"}, params) == ([{"id": "sb-1"}], True)
    assert params["cursor"] == "c2"
    assert _wire.path_params("/x", ("recursive", True)) == {"path": "/x", "recursive": "true"}
    assert _wire.snapshot_body(None, None) is None
    sync, aio = sandgate.Client("http://gw/", "t"), sandgate.AsyncClient("http://gw/", "t")
    assert sync._headers(None) == aio._headers(None) and sync._url("/v1") == "http://gw/v1"
    assert repr(aio) == "AsyncClient(base_url='http://gw')"
    sync.close()


def test_the_retry_decision_raises_the_answers_error_when_it_will_not_send_again():
    body = b'{"error": {"code": "overloaded", "message": "busy", "details": {}}}'
    policy = sandgate.RetryPolicy(max_attempts=2)
    assert _wire.retry_delay(policy, 1, "GET", 503, body, {"retry-after": "0"}) == 0.0
    try:
        _wire.retry_delay(policy, 2, "GET", 503, body, {})
        raise AssertionError("the last attempt was retried")
    except sandgate.Unavailable as e:
        assert e.code == "overloaded"


def test_a_lifecycle_answer_keeps_the_egress_token_only_the_create_showed():
    created = SandboxInfo(**SandboxInfo.fields_from({"id": "sb-1", "state": "running", "egress": {"token": "sgp_t"}}))
    paused = _wire.keep_info(created, {"id": "sb-1", "state": "paused"})
    assert paused is not None and paused.state == "paused" and paused.egress_token == "sgp_t"
    assert _wire.keep_info(created, None) is created


def test_event_following_gives_up_after_five_empty_streams_but_not_on_events():
    follow = _wire.EventFollow("sb-1", None, None)
    for _ in range(5):
        assert follow.open() is None
        follow.ended()
    follow.open()
    assert follow.feed("id: 9") is None and follow.feed('data: {"state": "running"}') is None
    event = follow.feed("")
    assert event is not None and event.id == "9" and follow.failures == 0
    follow.ended()  # it brought an event: not a failure
    assert follow.open() == {"last-event-id": "9"}
    for _ in range(5):
        follow.ended()
    try:
        follow.ended()
        raise AssertionError("a sixth empty stream was accepted")
    except sandgate.SandgateError as e:
        assert e.code == "events_ended"


def test_exec_output_collects_the_result_and_an_early_end_is_an_error():
    out = _wire.ExecOutput()
    for line in ('{"type":"started","exec_id":"ex-1"}', '{"type":"stdout","text":"a"}', '{"type":"exit","code":3}'):
        out._take(line)
    out._finish()
    assert out.result is not None and (out.result.exit_code, out.result.stdout, out.exec_id) == (3, "a", "ex-1")
    cut = _wire.ExecOutput()
    cut._take('{"type":"stdout","text":"a"}')
    try:
        cut._finish()
        raise AssertionError("a stream without exit gave a result")
    except sandgate.SandgateError as e:
        assert e.code == "exec_interrupted"
