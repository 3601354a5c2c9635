"""The Python SDK against a real gateway (run by tests/it/sdk_python.rs, which starts it:
see tests/it/common/own_sdk.rs for its pools, policies and origin). The same scenarios as
sdk/typescript/scenarios/scenarios.test.mjs.

Environment: SANDGATE_URL, SANDGATE_TOKEN (alice, workspace ws-a), SANDGATE_TOKEN_B (bob,
ws-b), SANDGATE_WORKSPACE, SANDGATE_ORIGIN_PORT (the HTTPS origin behind api.allowed.test and
api.other.test), SANDGATE_FAKE_DAYTONA (the fake Daytona behind the pool `daytona`),
SANDGATE_STORE_PATH (the gateway's SQLite database), SANDGATE_SNAPSHOT_DIR (the local
provider's snapshots), SANDGATE_CA (the gateway's CA certificate), SANDGATE_PORTS_ADDR (its
ports listener).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import pathlib
import sqlite3
import ssl
import time
import uuid

import httpx
import pytest

import sandgate
from sandgate import AsyncClient, Client, RetryPolicy

URL = os.environ["SANDGATE_URL"]
PORT = int(os.environ["SANDGATE_ORIGIN_PORT"])
SECRET = "sk_sdk_python_scenario_" + uuid.uuid4().hex
FAILOVER = {
    "labels": {"suite": "python"},
    "network": {"allow_domains": ["api.allowed.test"]},
    "routing": {"priorities": ["price"]},
}
LOCAL = {"provider": "local", "labels": {"suite": "python"}}


@pytest.fixture(scope="module")
def client():
    with Client(workspace=os.environ["SANDGATE_WORKSPACE"]) as c:
        yield c


@pytest.fixture(scope="module")
def sandbox(client):
    sb = client.sandboxes.create(LOCAL)
    yield sb
    sb.delete()


def test_create_with_routing_and_network_follows_a_failover_that_advances_twice(client):
    seen = []
    key = "py-failover-" + uuid.uuid4().hex
    resumed = []
    hooks = {"request": [lambda r: resumed.append(r.headers.get("last-event-id"))]}
    watched = Client(http=httpx.Client(event_hooks=hooks))
    sb = watched.sandboxes.create(FAILOVER, idempotency_key=key, on_event=seen.append)
    assert sb.state == "running"
    assert sb.info.pool == "local"
    assert sb.egress_token, "the first create's answer carries the egress token"
    assert sb.egress_token not in repr(sb) and sb.egress_token not in repr(sb.info)
    events = seen
    ended = [e.attempt for e in events if e.type == "attempt_ended"]
    assert [(a.pool, a.outcome) for a in ended] == [
        ("sim-slow", "advance"),
        ("sim-full", "advance"),
        ("local", "success"),
    ]
    assert [e.attempt.pool for e in events if e.type == "attempt_started"] == [
        "sim-slow",
        "sim-full",
        "local",
    ]
    assert events[-1].type == "done" and events[-1].data["state"] == "running"
    # The gateway ends each stream after a second and the create took longer: the client
    # came back with Last-Event-ID, and no event was lost or repeated.
    assert any(resumed), resumed
    ids = [int(e.id) for e in events]
    assert ids == sorted(set(ids)), ids
    # Followed live, not replayed: the stream began while the create was still placing (a
    # stream opened after the end replays the attempts first).
    assert events[0].type == "state" and events[0].data["state"] in ("pending", "provisioning")
    assert [a.pool for a in sb.info.attempts] == ["sim-slow", "sim-full", "local"]
    # Network: the sandbox reaches the allowed origin through the proxy, not another.
    ok = sb.exec(f"curl -s -o /dev/null -w '%{{http_code}}' https://api.allowed.test:{PORT}/net")
    assert ok.stdout == "200", ok
    denied = sb.exec(f"curl -s -o /dev/null -w '%{{http_code}}' https://api.other.test:{PORT}/net")
    assert denied.stdout != "200", denied

    # A stream opened after the create ended replays the record (every attempt, then the
    # final state, then done); Last-Event-ID after its second event gives exactly the rest.
    all_events = list(client.sandboxes.events(sb.id))
    attempts = lambda evs: [(e.type, e.attempt.pool) for e in evs if e.attempt]  # noqa: E731
    assert attempts(all_events) == attempts(events)
    assert [e.type for e in all_events[-2:]] == ["state", "done"]
    rest = list(client.sandboxes.events(sb.id, last_event_id=all_events[1].id))
    assert [(e.type, e.id) for e in rest] == [(e.type, e.id) for e in all_events[2:]]

    # Idempotent replay: the same sandbox, without the token; another body conflicts.
    again = client.sandboxes.create(FAILOVER, idempotency_key=key)
    assert again.id == sb.id and again.egress_token is None
    with pytest.raises(sandgate.IdempotencyConflict) as conflict:
        client.sandboxes.create({**FAILOVER, "labels": {"suite": "other"}}, idempotency_key=key)
    assert conflict.value.status == 409 and conflict.value.request_id

    # Explain matches what the server recorded when it accepted the create.
    explained = client.routes.explain(FAILOVER)
    assert explained["order"] == sb.info.raw["placement_record"]["explanation"]["order"]
    assert explained["order"] == ["sim-slow", "sim-full", "local", "sim-ok"]
    sb.delete()
    # A replay after the delete is the same sandbox, deleted (not a new one, not an error).
    replayed = client.sandboxes.create(FAILOVER, idempotency_key=key)
    assert (replayed.id, replayed.state) == (sb.id, "deleted")


def test_exec_streams_in_order_with_exit_codes(sandbox):
    result = sandbox.exec("echo a; echo b >&2; echo c; exit 3")
    assert (result.exit_code, result.reason) == (3, "exited")
    assert (result.stdout, result.stderr) == ("a\nc\n", "b\n")
    assert sandbox.exec(["true"]).exit_code == 0
    assert sandbox.exec(["false"]).exit_code == 1
    env = sandbox.exec("echo $GREETING; pwd", env={"GREETING": "hi"}, cwd="/tmp")
    assert env.stdout == "hi\n/tmp\n"

    with sandbox.exec(
        "for i in 1 2 3; do echo out$i; sleep 0.3; echo err$i >&2; sleep 0.3; done", stream=True
    ) as stream:
        events = [(e.type, e.text) for e in stream if e.type in ("stdout", "stderr")]
    assert events == [
        ("stdout", "out1\n"), ("stderr", "err1\n"),
        ("stdout", "out2\n"), ("stderr", "err2\n"),
        ("stdout", "out3\n"), ("stderr", "err3\n"),
    ]
    assert stream.result.exit_code == 0 and stream.exec_id

    # Output arrives while the command runs, not at its end.
    arrivals = []
    begun = time.monotonic()
    sandbox.exec("echo first; sleep 1; echo second", on_stdout=lambda d: arrivals.append(time.monotonic() - begun))
    assert len(arrivals) == 2 and arrivals[1] - arrivals[0] > 0.7

    timed = sandbox.exec(["sleep", "10"], timeout=0.5)
    assert timed.reason == "timed_out"

    # Output that is not UTF-8 arrives as the bytes it was.
    raw = sandbox.exec(r"printf '\377\376ok'")
    assert raw.stdout_bytes == b"\xff\xfeok"

    # Cancelling kills the command; its stream ends with reason `cancelled`.
    with sandbox.exec(["sleep", "30"], stream=True) as running:
        for event in running:
            if event.type == "started":
                running.cancel()
    assert running.result.reason == "cancelled"


def test_a_port_is_reached_through_the_gateway(sandbox):
    sandbox.exec(
        "mkdir -p /tmp/site && echo port-ok > /tmp/site/k && cd /tmp/site && "
        "nohup python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &"
    )
    access = sandbox.port(8000)
    assert access["url"] == "https://" + access["host"] and access["public"] is False
    name = access["host"].rsplit(":", 1)[0]
    tls = ssl.create_default_context(cafile=os.environ["SANDGATE_CA"])
    listener = os.environ["SANDGATE_PORTS_ADDR"]
    with httpx.Client(verify=tls, trust_env=False, timeout=15) as http:

        def get(headers):
            # The listener by address, the port's name in the TLS server name and Host.
            headers = {"host": access["host"], **headers}
            return http.get(f"https://{listener}/k", headers=headers, extensions={"sni_hostname": name})

        deadline = time.monotonic() + 30
        answer = get({access["token_header"]: access["token"]})
        while answer.status_code == 502 and time.monotonic() < deadline:
            time.sleep(0.2)
            answer = get({access["token_header"]: access["token"]})
        assert (answer.status_code, answer.text) == (200, "port-ok\n")
        assert get({}).status_code == 401
    with pytest.raises(sandgate.InvalidRequest):
        sandbox.port(0)


def test_files_round_trip_including_a_5_mib_binary(sandbox):
    sandbox.files.mkdir("/home/user/sdk/deep", parents=True)
    blob = os.urandom(5 * 1024 * 1024)
    sandbox.files.write("/home/user/sdk/deep/blob.bin", blob)
    sandbox.files.write("/home/user/sdk/hello.txt", "hello")
    assert sandbox.files.read("/home/user/sdk/deep/blob.bin") == blob
    assert sandbox.files.read_text("/home/user/sdk/hello.txt") == "hello"
    entries = {e.name: e for e in sandbox.files.list("/home/user/sdk")}
    assert entries["hello.txt"].size == 5 and entries["deep"].kind.startswith("dir")
    assert [e.size for e in sandbox.files.list("/home/user/sdk/deep")] == [len(blob)]
    checksum = sandbox.exec("sha256sum /home/user/sdk/deep/blob.bin | cut -d' ' -f1")
    import hashlib

    assert checksum.stdout.strip() == hashlib.sha256(blob).hexdigest()
    sandbox.files.remove("/home/user/sdk/hello.txt")
    assert "hello.txt" not in [e.name for e in sandbox.files.list("/home/user/sdk")]
    sandbox.files.remove("/home/user/sdk", recursive=True)
    with pytest.raises(sandgate.NotFound):
        sandbox.files.read("/home/user/sdk/deep/blob.bin")


def test_lifecycle(client):
    sb = client.sandboxes.create(LOCAL)
    sb.files.write("/home/user/keep.txt", "kept")
    assert sb.pause().state == "paused"
    assert sb.resume().state == "running"
    before = int(time.time() * 1000)
    sb.set_lifetime(3600)
    assert before + 3590_000 <= sb.info.expires_ms <= before + 3610_000
    assert sb.stop().state == "stopped"
    with pytest.raises(sandgate.Conflict) as stopped:
        sb.exec("true")
    assert stopped.value.code == "sandbox_state"
    assert sb.start().state == "running"
    assert sb.exec("cat /home/user/keep.txt").stdout == "kept"
    snap = sb.snapshot()
    assert snap["snapshot"]["id"] and snap["snapshot"]["kind"] == "provider"
    assert (snap["snapshot"]["sandbox_id"], snap["snapshot"]["pool"]) == (sb.id, "local")
    assert "export" not in snap
    listed = [s.id for s in client.sandboxes.list(label={"suite": "python"}, state="running")]
    assert sb.id in listed
    assert sb.delete().state == "deleted"
    assert client.sandboxes.get(sb.id).state == "deleted"


def test_dry_run_creates_nothing(client):
    before = [s.id for s in client.sandboxes.list()]
    plan = client.sandboxes.create(FAILOVER, dry_run=True)
    assert plan.would_create and plan.first_pool == "sim-slow"
    assert [p["pool"] for p in plan.plan] == ["sim-slow", "sim-full", "local", "sim-ok"]
    assert [s.id for s in client.sandboxes.list()] == before


def test_a_credential_is_injected_for_its_destination_only(client):
    cred = client.credentials.create(
        "sdk-py",
        secret=SECRET,
        destinations=[{"host": "api.allowed.test", "ports": [PORT]}],
        apply={"type": "header", "name": "authorization", "template": "Bearer {secret}"},
        placeholder_env="SDK_TOKEN",
    )
    assert SECRET not in repr(cred) and SECRET not in json.dumps(cred.raw)
    assert "sdk-py" in [c.name for c in client.credentials.list()]
    sb = client.sandboxes.create(
        {
            "provider": "local",
            "credentials": ["sdk-py"],
            "network": {"allow_domains": ["api.allowed.test", "api.other.test"]},
        }
    )

    def seen_by(host, header=True):
        auth = '-H "Authorization: Bearer $SDK_TOKEN"' if header else ""
        out = sb.exec(f"curl -s {auth} https://{host}:{PORT}/cred")
        assert out.exit_code == 0, out
        return json.loads(out.stdout)

    assert seen_by("api.allowed.test")["headers"]["authorization"] == f"Bearer {SECRET}"
    # Elsewhere the placeholder is neither replaced nor forwarded: the proxy refuses.
    other = seen_by("api.other.test")
    assert other["error"]["code"] == "credential_destination_mismatch", other
    assert SECRET not in json.dumps(other)
    assert "authorization" not in seen_by("api.other.test", header=False)["headers"]
    assert SECRET not in sb.exec("env").stdout

    rotated = client.credentials.rotate("sdk-py", secret=SECRET + "-2")
    assert rotated.version is None or rotated.version >= 1
    assert seen_by("api.allowed.test")["headers"]["authorization"] == f"Bearer {SECRET}-2"
    sb.delete()
    client.credentials.delete("sdk-py")
    assert "sdk-py" not in [c.name for c in client.credentials.list()]


def test_a_delegated_exec_only_client_cannot_write_files_or_delete(client, sandbox):
    until = dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=10)
    delegation = sandbox.delegate(["exec"], agent="py-agent", until=until)
    assert delegation.token and delegation.token not in repr(delegation)
    assert delegation.actions == ["exec"]
    assert abs(delegation.expires_ms / 1000 - until.timestamp()) < 5
    with Client.from_delegation(delegation) as agent:
        box = agent.sandbox()
        assert box.exec("echo from-agent").stdout == "from-agent\n"
        for forbidden in (
            lambda: box.files.write("/home/user/x", "x"),
            lambda: box.delete(),
            lambda: agent.sandboxes.list(),
            lambda: agent.sandboxes.create(LOCAL),
        ):
            with pytest.raises(sandgate.PermissionDenied) as denied:
                forbidden()
            assert denied.value.code == "delegation_scope"
        assert [d.id for d in client.delegations.list(sandbox.id)] == [delegation.id]
        client.delegations.revoke(delegation.id)
        with pytest.raises(sandgate.Unauthenticated):
            box.exec("true")


def test_every_error_class_from_a_real_server_condition(client, sandbox):
    no_retry = Client(retry=RetryPolicy(max_attempts=1))
    with pytest.raises(sandgate.InvalidRequest) as invalid:
        client.sandboxes.create({"provider": "local", "bogus": 1})
    assert invalid.value.field == "bogus" and invalid.value.request_id
    with pytest.raises(sandgate.Unauthenticated):
        Client(token="not-a-token").pools.list()
    with pytest.raises(sandgate.NotFound) as missing:
        client.sandboxes.get("sb-does-not-exist")
    assert missing.value.request_id
    with pytest.raises(sandgate.PolicyDenied) as refused:
        client.sandboxes.create({**LOCAL, "labels": {"tier": "blocked"}})
    assert refused.value.layer == "creation"
    assert any("tier = blocked" in r for r in refused.value.reasons)
    with pytest.raises(sandgate.NoEligibleProvider) as nowhere:
        client.sandboxes.create({"regions": ["mars-1"]})
    assert nowhere.value.attempts and all("regions" in a.unmet_requirements for a in nowhere.value.attempts)
    with pytest.raises(sandgate.PermissionDenied) as other_ws:
        Client(token=os.environ["SANDGATE_TOKEN_B"]).credentials.list(workspace="ws-a")
    assert other_ws.value.code == "forbidden"
    with pytest.raises(sandgate.PayloadTooLarge):
        client.sandboxes.create({**LOCAL, "labels": {"big": "x" * (2 * 1024 * 1024)}})
    elsewhere = client.sandboxes.create({"provider": "sim-late"})
    with pytest.raises(sandgate.Unsupported) as unsupported:
        elsewhere.exec("true")
    assert unsupported.value.status == 501
    elsewhere.delete()
    with pytest.raises(sandgate.Unavailable) as unavailable:
        no_retry.sandboxes.create({"provider": "sim", "routing": {"pin_pool": "sim-full"}})
    assert unavailable.value.code == "creation_failed"
    # A keyed create that ends in creation_failed is stored under its key: the retry rule
    # does not send it again (a resend could only replay the same failure).
    posts = []
    counting = Client(
        retry=RetryPolicy(max_attempts=3, base_delay=0.01),
        http=httpx.Client(event_hooks={"request": [lambda r: posts.append(r.method) if r.method == "POST" else None]}),
    )
    key = "py-stored-failure-" + uuid.uuid4().hex
    full = {"provider": "sim", "routing": {"pin_pool": "sim-full"}}
    with pytest.raises(sandgate.Unavailable) as stored:
        counting.sandboxes.create(full, idempotency_key=key)
    assert stored.value.code == "creation_failed" and stored.value.status == 503
    assert posts == ["POST"], posts
    with pytest.raises(sandgate.Unavailable) as replayed:
        counting.sandboxes.create(full, idempotency_key=key)
    assert replayed.value.details["sandbox_id"] == stored.value.details["sandbox_id"]
    assert posts == ["POST", "POST"], posts
    counting.close()
    # Two event streams are the gateway's limit: a third is refused, with Retry-After.
    # (Each stream lives a second: a machine stalled that long would free a slot first, so
    # the setup is tried again then.)
    placing = client.sandboxes.create(FAILOVER, wait=False)
    limited = None
    for _ in range(3):
        first = client.sandboxes.events(placing.id)
        second = client.sandboxes.events(placing.id)
        third = no_retry.sandboxes.events(placing.id)
        try:
            next(first), next(second)
            next(third)
        except sandgate.RateLimited as e:
            limited = e
            break
        finally:
            first.close(), second.close(), third.close()
    assert limited is not None, "a third event stream was never refused"
    assert limited.retry_after == 1 and limited.code == "rate_limited"
    no_retry.close()


def _rename_table(old, new):
    # Another process changes the gateway's database under it, as an operator's mistake or a
    # broken migration would; the gateway's next statement on the table fails in SQLite.
    with contextlib.closing(sqlite3.connect(os.environ["SANDGATE_STORE_PATH"], timeout=10, isolation_level=None)) as db:
        db.execute(f"ALTER TABLE {old} RENAME TO {new}")


def test_a_failure_inside_the_gateway_is_an_internal_error(client, sandbox):
    # The store's `snapshots` table disappears under the running gateway: the local provider
    # takes the snapshot, sandgate cannot record it, removes it and answers 500 `internal`
    # with a message that names nothing of the cause (that is in its log, under the request id).
    snapshots = pathlib.Path(os.environ["SANDGATE_SNAPSHOT_DIR"])
    before = sorted(p.name for p in snapshots.iterdir())
    _rename_table("snapshots", "snapshots_away")
    try:
        with pytest.raises(sandgate.InternalError) as internal:
            sandbox.snapshot()
        failed = internal.value
        assert (failed.code, failed.status) == ("internal", 500) and failed.request_id
        said = (failed.message + json.dumps(failed.details)).lower()
        for leak in ("snapshots", "sqlite", "no such table", "insert", "database", "sql"):
            assert leak not in said, failed
        # The provider's snapshot that sandgate could not record is not left behind.
        assert sorted(p.name for p in snapshots.iterdir()) == before
    finally:
        _rename_table("snapshots_away", "snapshots")
    again = sandbox.snapshot()
    assert (snapshots / (again["snapshot"]["id"] + ".tar")).is_file()
    assert sorted(p.name for p in snapshots.iterdir()) == sorted(before + [again["snapshot"]["id"] + ".tar"])


def test_the_async_client_does_the_same():
    async def main():
        async with AsyncClient(workspace=os.environ["SANDGATE_WORKSPACE"]) as ac:
            events = []
            sb = await ac.sandboxes.create(FAILOVER, on_event=events.append)
            assert sb.state == "running" and sb.info.pool == "local"
            assert [e.attempt.outcome for e in events if e.type == "attempt_ended"] == [
                "advance",
                "advance",
                "success",
            ]
            result = await sb.exec("echo a; echo b >&2; exit 4")
            assert (result.exit_code, result.stdout, result.stderr) == (4, "a\n", "b\n")
            # Streaming, as the sync client's exec(stream=True): events in order, then the result.
            async with sb.exec(
                "for i in 1 2; do echo out$i; sleep 0.3; echo err$i >&2; sleep 0.3; done; exit 2",
                stream=True,
            ) as stream:
                seen = [(e.type, e.text) async for e in stream if e.type in ("stdout", "stderr")]
            assert seen == [("stdout", "out1\n"), ("stderr", "err1\n"), ("stdout", "out2\n"), ("stderr", "err2\n")]
            assert stream.result is not None and stream.result.exit_code == 2 and stream.exec_id
            # cancel() ends a running command; its stream ends with reason `cancelled`.
            async with sb.exec(["sleep", "30"], stream=True) as running:
                async for event in running:
                    if event.type == "started":
                        await running.cancel()
            assert running.result is not None and running.result.reason == "cancelled"
            await sb.files.write("/home/user/a.bin", b"\x00\xff" * 1000)
            assert await sb.files.read("/home/user/a.bin") == b"\x00\xff" * 1000
            with pytest.raises(sandgate.NotFound):
                await ac.sandboxes.get("sb-nope")
            await sb.delete()

    asyncio.run(main())


def test_an_operation_the_hosted_provider_fails_is_an_upstream_error(client):
    # The pool `daytona` is a hosted provider (the fake Daytona, over a real socket); its
    # toolbox fault makes every command and file call answer 500 until cleared.
    fault = os.environ["SANDGATE_FAKE_DAYTONA"] + "/_fake/toolbox-fault"
    hosted = client.sandboxes.create({"provider": "daytona", "labels": {"suite": "python"}})
    try:
        assert (hosted.state, hosted.info.pool) == ("running", "daytona")
        hosted.files.write("/home/daytona/note.txt", b"kept")
        assert hosted.exec("echo up").stdout == "up\n"
        httpx.post(fault, json={"status": 500}).raise_for_status()
        try:
            with pytest.raises(sandgate.UpstreamError) as upstream:
                hosted.files.list("/home/daytona")
            failed = upstream.value
            assert (failed.status, failed.code) == (502, "provider_error"), (failed.status, failed.code)
            assert "injected fault" in failed.message and failed.request_id
            with pytest.raises(sandgate.UpstreamError) as read:
                hosted.files.read("/home/daytona/note.txt")
            assert read.value.status == 502 and read.value.request_id != failed.request_id
            # A command's answer is a stream that has begun (200) before the provider is
            # asked: its failure ends the stream instead, with no exit code.
            broken = hosted.exec("echo up")
            assert broken.exit_code is None and "injected fault" in broken.stderr, broken
            # A provider that does not answer within the account's 2 s request timeout: 504
            # `upstream_timeout`, the same class.
            httpx.delete(fault).raise_for_status()
            httpx.post(fault, json={"hang_ms": 4000}).raise_for_status()
            started = time.monotonic()
            with pytest.raises(sandgate.UpstreamError) as slow:
                hosted.files.list("/home/daytona")
            assert (slow.value.status, slow.value.code) == (504, "upstream_timeout"), slow.value
            assert slow.value.request_id and time.monotonic() - started < 3.9
        finally:
            httpx.delete(fault).raise_for_status()
        # The provider failed the operation, not the sandbox: it still runs.
        assert client.sandboxes.get(hosted.id).state == "running"
        assert hosted.exec("echo again").stdout == "again\n"
        assert hosted.files.read("/home/daytona/note.txt") == b"kept"
    finally:
        hosted.delete()


def test_pools_list_every_configured_pool(client):
    assert sorted(p["pool"] for p in client.pools.list()) == ["daytona", "local", "sim-full", "sim-ok", "sim-slow"]


@pytest.mark.parametrize(
    "example,expected",
    [
        ("failover.py", ["attempt 1 on sim-slow: started", "advance", "runs on local"]),
        ("exec_only_agent.py", ["hello from the agent", "files.write refused: delegation_scope"]),
        ("bound_credential.py", ["sandbox sees: sgph_", f'"authorization":"Bearer {SECRET}"']),
    ],
)
def test_the_examples_run(example, expected):
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "examples" / "sdk" / "python" / example
    env = dict(os.environ, EXAMPLE_HOST="api.allowed.test", EXAMPLE_PORT=str(PORT), EXAMPLE_SECRET=SECRET)
    run = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    for text in expected:
        assert text in run.stdout, run.stdout
    # The credential's secret reaches the origin only; the example prints nothing else of it.
    assert run.stdout.count(SECRET) <= 1


@pytest.mark.parametrize(
    "readme,heading",
    [("README.md", "## SDKs: Python and TypeScript"), ("sdk/python/README.md", "## Quickstart")],
)
def test_the_readme_quickstarts_run(readme, heading):
    import re
    import subprocess
    import sys
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / readme).read_text()
    section = text[text.index(heading):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, code + run.stdout + run.stderr
    assert "attempt_ended" in run.stdout, run.stdout
