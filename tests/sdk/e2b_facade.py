"""Drives the official E2B Python SDK against sandgate's E2B-compatible API (src/facade).

Run by tests/it/e2b_facade.rs, which starts sandgate with `[e2b] listen` and passes, in the
environment: E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL (both the facade's origin), and:

- FACADE_SDK_VERSION: the e2b release expected (the script checks it is the one imported);
- FACADE_ALLOWED_URL / FACADE_DENIED_URL: HTTPS origins; a sandbox created with
  network.allow_out = [the allowed host] reaches the first with curl and gets 403 from the
  second (sandgate's proxy refuses it);
- FACADE_DENIED_WORD: a command containing it is refused by the action policy;
- FACADE_DENIED_META: metadata {"tier": <it>} is refused by the creation policy.

Prints `FACADE OK {json}` as its last line when every step held; any failed check raises.
"""

import importlib.metadata
import json
import os
import sys
import time
import uuid
from datetime import datetime, timezone

from e2b import (
    AuthenticationException,
    CommandExitException,
    InvalidArgumentException,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)


def check(condition, what):
    if not condition:
        raise AssertionError(what)
    print(f"ok - {what}", flush=True)


def raises(kind, fn, what):
    try:
        fn()
    except kind as e:
        check(True, f"{what}: {type(e).__name__}")
        return e
    raise AssertionError(f"{what}: expected {kind.__name__}")


def listed(query):
    """Every sandbox id the list endpoint returns for `query`, following the pages."""
    paginator = Sandbox.list(query=query, limit=1)
    ids = []
    while paginator.has_next:
        ids.extend(s.sandbox_id for s in paginator.next_items())
    return ids


def commands(sbx):
    ok = sbx.commands.run("echo hi")
    check(ok.exit_code == 0 and ok.stdout == "hi\n", f"commands.run('echo hi'): {ok.stdout!r}")

    env = sbx.commands.run('echo "$GREETING $PER_COMMAND"', envs={"PER_COMMAND": "per-command"})
    check(env.stdout == "from-create per-command\n", f"envVars and per-command envs: {env.stdout!r}")

    failed = raises(
        CommandExitException,
        lambda: sbx.commands.run("echo out; echo err 1>&2; exit 3"),
        "a non-zero exit raises",
    )
    check(failed.exit_code == 3, f"exit code {failed.exit_code}")
    check(failed.stdout == "out\n" and failed.stderr == "err\n", "stdout and stderr apart")

    background = sbx.commands.run("sleep 30", background=True)
    check(background.pid in [p.pid for p in sbx.commands.list()], "commands.list shows the background command")
    check(background.kill() is True, "kill the background command")
    killed = raises(CommandExitException, background.wait, "a killed command's wait raises")
    check(killed.exit_code == -1 and killed.error == "signal: killed", f"killed: {killed.exit_code} {killed.error!r}")
    check(sbx.commands.kill(background.pid) is False, "kill after the end: not found")

    raises(TimeoutException, lambda: sbx.commands.run("sleep 10", timeout=1), "a command past its timeout")

    # `user`: E2B's default user is the pool's default user; one the pool does not declare
    # is refused with the reason, never ignored (the command would run as someone else).
    me = sbx.commands.run("id -u", user="user")
    check(me.stdout == "65534\n", f"user='user' runs as the default user: {me.stdout!r}")
    root = raises(InvalidArgumentException, lambda: sbx.commands.run("id -u", user="root"), "user='root' undeclared")
    check('"root" is not declared' in str(root), f"the refusal names the user: {root}")


def files(sbx):
    text = "hello from files.write\n"
    written = sbx.files.write("/home/user/notes.txt", text)
    check(written.path == "/home/user/notes.txt", f"files.write: {written.path}")
    check(sbx.files.read("/home/user/notes.txt") == text, "files.read round trip")
    blob = bytes(range(256)) * 64
    written = sbx.files.write("data/blob.bin", blob, use_octet_stream=True)
    check(written.path == "/home/user/data/blob.bin", f"files.write relative, octet-stream: {written.path}")
    check(bytes(sbx.files.read("data/blob.bin", format="bytes")) == blob, "bytes round trip")
    names = sorted(e.name for e in sbx.files.list("/home/user"))
    check("notes.txt" in names and "data" in names, f"files.list: {names}")
    check(sbx.commands.run("cat /home/user/notes.txt").stdout == text, "a command sees the written file")
    check(sbx.files.exists("/home/user/notes.txt"), "files.exists")
    check(not sbx.files.exists("/home/user/missing"), "files.exists: missing")
    check(sbx.files.make_dir("/home/user/work/deep") is True, "files.make_dir")
    check(sbx.files.make_dir("/home/user/work/deep") is False, "files.make_dir again: exists")
    moved = sbx.files.rename("/home/user/notes.txt", "/home/user/work/notes.txt")
    check(moved.path == "/home/user/work/notes.txt", f"files.rename: {moved.path}")
    check(not sbx.files.exists("/home/user/notes.txt"), "files.rename: the source is gone")
    check(sbx.files.read("/home/user/work/notes.txt") == text, "files.rename: the content moved")
    sbx.files.remove("/home/user/work")
    check(not sbx.files.exists("/home/user/work"), "files.remove")
    raises(NotFoundException, lambda: sbx.files.read("/home/user/missing"), "files.read of a missing file")


def egress(allowed, denied):
    """network.allow_out becomes the proxy's allow list."""
    host = allowed.split("//", 1)[1].split(":", 1)[0].split("/", 1)[0]
    sbx = Sandbox.create(network={"allow_out": [host], "deny_out": ["0.0.0.0/0"]}, timeout=60)
    ok = sbx.commands.run(f"curl -sS -o /dev/null -w '%{{http_code}}' {allowed}")
    check(ok.stdout == "200", f"curl to the allowed origin: {ok.stdout!r}")
    # Refused at the proxy's CONNECT: curl reports the proxy's answer and exits 56.
    refused = raises(
        CommandExitException,
        lambda: sbx.commands.run(f"curl -sS -o /dev/null {denied}"),
        "curl to another origin fails",
    )
    check("CONNECT tunnel failed, response 403" in refused.stderr, f"the proxy answers 403: {refused.stderr!r}")
    check(sbx.kill() is True, "kill the egress sandbox")
    return sbx.sandbox_id


def refusals(word, meta):
    sbx = Sandbox.create(timeout=60)
    e = raises(SandboxException, lambda: sbx.commands.run(f"echo {word}"), "a command the action policy denies")
    check("policy_denied" in str(e) and "facade test forbids" in str(e), f"the policy's reason reaches the SDK: {e}")
    sbx.kill()
    e = raises(SandboxException, lambda: Sandbox.create(metadata={"tier": meta}), "a create the creation policy denies")
    check("forbidden" in str(e) and "tier=blocked is refused" in str(e), f"the creation policy's reason: {e}")


def expiry():
    """A sandbox's timeout is a lifetime sandgate enforces: past it, the sandbox is gone."""
    sbx = Sandbox.create(timeout=2)
    give_up = time.monotonic() + 30
    while time.monotonic() < give_up:
        try:
            Sandbox.get_info(sbx.sandbox_id)
        except NotFoundException:
            check(True, "a sandbox past its timeout is gone")
            return sbx.sandbox_id
        time.sleep(0.25)
    raise AssertionError("a sandbox created with timeout=2 still exists after 30 s")


def main():
    assert not os.environ.get("E2B_DEBUG"), "E2B_DEBUG would bypass the API"
    version = importlib.metadata.version("e2b")
    print(f"e2b SDK {version}", flush=True)
    expected = os.environ.get("FACADE_SDK_VERSION")
    if expected:
        check(version == expected, f"the e2b SDK is {expected}")
    run = uuid.uuid4().hex[:12]

    sbx = Sandbox.create(
        template="base",
        timeout=120,
        metadata={"suite": "facade", "run": run},
        envs={"GREETING": "from-create"},
    )
    check(bool(sbx.sandbox_id), f"created {sbx.sandbox_id}")
    info = sbx.get_info()
    check(info.state == SandboxState.RUNNING, "get_info: running")
    check(info.metadata.get("run") == run and info.template_id == "base", "get_info: metadata, template")

    commands(sbx)
    files(sbx)

    other = Sandbox.create(metadata={"suite": "facade", "run": "other-" + run}, timeout=60)
    check(listed(SandboxQuery(metadata={"run": run})) == [sbx.sandbox_id], "Sandbox.list by metadata")
    both = sorted(listed(SandboxQuery(metadata={"suite": "facade"})))
    check(both == sorted([sbx.sandbox_id, other.sandbox_id]), f"Sandbox.list, one per page: {both}")
    check(other.kill() is True, "kill the second sandbox")

    sbx.set_timeout(45)
    left = (sbx.get_info().end_at - datetime.now(timezone.utc)).total_seconds()
    check(35 < left <= 46, f"set_timeout(45): {left:.0f} s left")

    raises(AuthenticationException, lambda: Sandbox.list(api_key="e2b_" + "0" * 40).next_items(), "a wrong API key")

    result = {"sdk": version, "sandbox": sbx.sandbox_id, "run": run}
    if os.environ.get("FACADE_ALLOWED_URL"):
        result["egress"] = egress(os.environ["FACADE_ALLOWED_URL"], os.environ["FACADE_DENIED_URL"])
    if os.environ.get("FACADE_DENIED_WORD"):
        refusals(os.environ["FACADE_DENIED_WORD"], os.environ["FACADE_DENIED_META"])

    if os.environ.get("FACADE_EXPIRY"):
        result["expired"] = expiry()

    check(sbx.kill() is True, "kill")
    check(Sandbox.kill(sbx.sandbox_id) is False, "kill again: not found")
    raises(NotFoundException, lambda: Sandbox.get_info(sbx.sandbox_id), "get_info after kill")

    print("FACADE OK " + json.dumps(result), flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - report whatever broke, then fail
        print(f"FACADE FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        raise
