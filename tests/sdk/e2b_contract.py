"""Drives the official E2B Python SDK against the fake E2B of tests/it/common/fakes/e2b.rs.

Run by tests/it/e2b_fake.rs, which starts the fake and passes its origin in the environment:
E2B_API_KEY, E2B_API_URL (the control plane) and E2B_SANDBOX_URL (envd on the same origin;
the SDK then sends every envd call there with E2b-Sandbox-Id / X-Access-Token headers).
E2B_DEBUG must stay unset: in debug mode the SDK skips the API on create, kill, connect
and set_timeout altogether.

Prints `CONTRACT OK {json}` as its last line when every step held; any failed check
raises and exits non-zero.
"""

import importlib.metadata
import json
import os
import sys
import time
import uuid

from e2b import (
    AuthenticationException,
    CommandExitException,
    FileType,
    NotFoundException,
    Sandbox,
    SandboxNotRunningException,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)


def check(condition, what):
    if not condition:
        raise AssertionError(what)
    print(f"ok - {what}", flush=True)


def listed(query, limit=None):
    """Every sandbox the list endpoint returns for `query`, following the pages."""
    paginator = Sandbox.list(query=query, limit=limit)
    pages = []
    while paginator.has_next:
        pages.append([s.sandbox_id for s in paginator.next_items()])
    return pages


def filesystem_rpcs(sbx, text):
    """envd's unary Connect calls: filesystem.Filesystem MakeDir, Stat, ListDir, Move, Remove."""
    check(sbx.files.make_dir("/home/user/work") is True, "files.make_dir")
    check(sbx.files.make_dir("/home/user/work") is False, "files.make_dir again: already exists")
    check(sbx.files.exists("/home/user/notes.txt"), "files.exists")
    check(not sbx.files.exists("/home/user/missing"), "files.exists: missing")
    names = sorted(e.name for e in sbx.files.list("/home/user"))
    check(names == ["data", "notes.txt", "work"], f"files.list: {names}")
    deep = [e.path for e in sbx.files.list("/home/user", depth=2)]
    check("/home/user/data/blob.bin" in deep, f"files.list depth 2: {deep}")
    entry = sbx.files.get_info("notes.txt")
    check(entry.size == len(text) and entry.type == FileType.FILE, f"files.get_info: {entry}")
    moved = sbx.files.rename("/home/user/notes.txt", "/home/user/work/notes.txt")
    check(moved.path == "/home/user/work/notes.txt", "files.rename")
    sbx.files.remove("/home/user/work")
    check(not sbx.files.exists("/home/user/work/notes.txt"), "files.remove")


def process_rpcs(sbx):
    """process.Process List, SendSignal, SendInput, CloseStdin, and the stream deadline."""
    sleeper = sbx.commands.run("sleep 30", background=True)
    check(sleeper.pid in [p.pid for p in sbx.commands.list()], "commands.list shows the background command")
    check(sleeper.kill() is True, "commands.kill")
    try:
        sleeper.wait()
        raise AssertionError("a killed command must raise CommandExitException")
    except CommandExitException as e:
        check(e.exit_code == -1 and e.error == "signal: killed", f"killed: {e.exit_code} {e.error!r}")
    check(sbx.commands.kill(sleeper.pid) is False, "commands.kill after the end: not found")

    reader = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(reader.pid, "piped\n")
    sbx.commands.close_stdin(reader.pid)
    check(reader.wait().stdout == "piped\n", "commands.send_stdin / close_stdin")

    try:
        sbx.commands.run("sleep 10", timeout=1)
        raise AssertionError("a command outliving its timeout must raise TimeoutException")
    except TimeoutException:
        check(True, "commands.run past its timeout: TimeoutException")
    give_up = time.monotonic() + 5
    while any(p.args[-1:] == ["sleep 10"] for p in sbx.commands.list()) and time.monotonic() < give_up:
        time.sleep(0.1)
    check(not any(p.args[-1:] == ["sleep 10"] for p in sbx.commands.list()), "the timed-out command is gone")


def snapshot_and_restore(sbx, blob):
    """A snapshot used as a template starts a sandbox with the source's files."""
    snap = sbx.create_snapshot()
    check(bool(snap.snapshot_id), f"create_snapshot: {snap.snapshot_id}")
    restored = Sandbox.create(template=snap.snapshot_id, metadata={"suite": "e2b-contract-restore"})
    data = bytes(restored.files.read("/home/user/data/blob.bin", format="bytes"))
    check(data == blob, "a sandbox created from the snapshot has the source's files")
    check(restored.kill() is True, "kill the restored sandbox")
    return {"id": restored.sandbox_id, "snapshot": snap.snapshot_id}


def main():
    assert not os.environ.get("E2B_DEBUG"), "E2B_DEBUG would bypass the API"
    version = importlib.metadata.version("e2b")
    expected = os.environ.get("E2B_SDK_EXPECTED_VERSION")
    print(f"e2b SDK {version}", flush=True)
    if expected:
        check(version == expected, f"the e2b SDK is the pinned {expected}")

    run = uuid.uuid4().hex[:12]

    # Control plane: create (POST /v2/sandboxes) with metadata, envs and egress settings.
    sbx = Sandbox.create(
        template="base",
        timeout=120,
        metadata={"suite": "e2b-contract", "run": run},
        envs={"CONTRACT_ENV": "from-create"},
        allow_internet_access=False,
        network={"allow_out": ["192.0.2.10"], "deny_out": ["0.0.0.0/0"]},
    )
    check(bool(sbx.sandbox_id), f"created sandbox {sbx.sandbox_id}")

    info = sbx.get_info()
    check(info.state == SandboxState.RUNNING, "get_info: running")
    check(info.metadata.get("run") == run, "get_info: metadata echoed")
    check(info.template_id == "base", "get_info: template")

    # envd: process.Process/Start as a Connect server stream, run for real.
    try:
        sbx.commands.run("echo hello; echo err 1>&2; exit 3")
        raise AssertionError("a command exiting 3 must raise CommandExitException")
    except CommandExitException as e:
        check(e.exit_code == 3, "commands.run: exit code 3")
        check(e.stdout == "hello\n", f"commands.run: stdout {e.stdout!r}")
        check(e.stderr == "err\n", f"commands.run: stderr {e.stderr!r}")

    ok = sbx.commands.run('echo "$CONTRACT_ENV $PER_COMMAND"', envs={"PER_COMMAND": "per-command"})
    check(ok.exit_code == 0, "commands.run: exit 0 (exitCode omitted on the wire)")
    check(ok.stdout == "from-create per-command\n", f"commands.run: envs {ok.stdout!r}")

    # envd: /files upload (multipart for str, octet-stream on request) and download.
    text = "hello from files.write\n"
    written = sbx.files.write("/home/user/notes.txt", text)
    check(written.path == "/home/user/notes.txt" and written.name == "notes.txt", "files.write: multipart")
    check(sbx.files.read("/home/user/notes.txt") == text, "files.read: text round trip")

    blob = bytes(range(256)) * 4
    written = sbx.files.write("data/blob.bin", blob, use_octet_stream=True)
    check(written.path == "/home/user/data/blob.bin", f"files.write: octet-stream, relative path {written.path}")
    check(bytes(sbx.files.read("/home/user/data/blob.bin", format="bytes")) == blob, "files.read: bytes round trip")

    cat = sbx.commands.run("cat notes.txt", cwd="/home/user")
    check(cat.stdout == text, "a command in cwd /home/user sees the written file")

    try:
        sbx.files.read("/../../../etc/hostname")
        raise AssertionError("a path above / must resolve inside the sandbox (and not exist there)")
    except NotFoundException:
        check(True, "files.read: '..' stays inside the sandbox")

    filesystem_rpcs(sbx, text)
    process_rpcs(sbx)
    restored = snapshot_and_restore(sbx, blob)

    # A second sandbox, to prove the metadata filter and the paging.
    other = Sandbox.create(template="base", metadata={"suite": "e2b-contract", "run": "other-" + run})
    by_run = listed(SandboxQuery(metadata={"run": run}))
    check(sum(by_run, []) == [sbx.sandbox_id], f"list by metadata run={run}: {by_run}")
    by_suite = listed(SandboxQuery(metadata={"suite": "e2b-contract"}), limit=1)
    check(
        len(by_suite) >= 2 and sorted(sum(by_suite, [])) == sorted([sbx.sandbox_id, other.sandbox_id]),
        f"list by suite, one per page: {by_suite}",
    )

    # Pause, then list by state, then connect (resume) and run again.
    check(other.pause() is True, "pause")
    paused = listed(SandboxQuery(metadata={"suite": "e2b-contract"}, state=[SandboxState.PAUSED]))
    check(sum(paused, []) == [other.sandbox_id], f"list state=paused: {paused}")
    resumed = Sandbox.connect(other.sandbox_id)
    check(resumed.commands.run("echo resumed").stdout == "resumed\n", "connect resumes a paused sandbox")
    resumed.set_timeout(60)
    check(other.kill() is True, "kill the second sandbox")

    # Authentication is checked.
    try:
        Sandbox.list(api_key="e2b_wrong").next_items()
        raise AssertionError("a wrong API key must be refused")
    except AuthenticationException:
        check(True, "wrong API key: AuthenticationException")

    # Kill, then the sandbox is gone everywhere.
    check(sbx.kill() is True, "kill")
    check(Sandbox.kill(sbx.sandbox_id) is False, "kill again: not found")
    check(listed(SandboxQuery(metadata={"run": run})) in ([], [[]]), "list after kill: gone")
    try:
        sbx.commands.run("true")
        raise AssertionError("a command in a killed sandbox must fail")
    except SandboxNotRunningException:
        check(True, "commands.run after kill: SandboxNotRunningException")

    print(
        "CONTRACT OK "
        + json.dumps(
            {
                "sdk": version,
                "sandbox": sbx.sandbox_id,
                "other": other.sandbox_id,
                "restored": restored,
                "run": run,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - report whatever broke, then fail
        print(f"CONTRACT FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        raise
