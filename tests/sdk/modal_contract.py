"""Drives the official Modal Python SDK (modal) against the fake Modal API.

Run by the Rust integration test with MODAL_SERVER_URL=http://127.0.0.1:PORT (plaintext h2c gRPC),
MODAL_TOKEN_ID / MODAL_TOKEN_SECRET and HOME at a temporary directory (no ~/.modal.toml).

modal 1.6.4 defaults to the V2 sandbox backend (config `sandbox_v2`), whose `*V2` RPCs sandgate does
not speak: sandgate's adapter speaks the V1 RPCs, so this script pins the SDK to V1
(MODAL_SANDBOX_V2=0) and to the `SandboxSnapshotFs` filesystem snapshot
(MODAL_USE_LEGACY_FILESYSTEM_SNAPSHOT=1; 1.6.4 otherwise snapshots through the command router's
TaskSnapshotFilesystem). Control plane (modal.client.ModalClient, x-modal-token-id/secret):
AppGetOrCreate, ImageFromId, SecretGetOrCreate (the create's `env`), SandboxCreate,
SandboxGetTaskId (create polls it until a task id), SandboxTagsSet/Get, SandboxList,
SandboxWait, SandboxTerminate, SandboxSnapshotFs, TaskGetCommandRouterAccess. Everything run
inside a sandbox goes through the task command router (modal.task_command_router.TaskCommandRouter:
TaskExecStart, TaskExecStdioRead, TaskExecStdinWrite, TaskExecWait) at the URL the fake hands
out, with `authorization: Bearer <jwt>`.

The fake's conventions this script relies on:

* "im-fake" is the base image; V1 sandbox ids have the V1 shape (`sb-` + 22 base62 chars: the SDK
  routes any other id to the V2 RPCs);
* commands run for real and /root (in argv, workdir and env values) is the sandbox's own
  directory: what one command writes there the next sees, and a filesystem snapshot carries it
  into a sandbox created from the snapshot image (`pwd` may show it as a host path ending in /root);
* commands see the create's `env` plus the exec's own `env`;
* the fake's next sandbox creates are scripted as `rate_limit` (RESOURCE_EXHAUSTED carrying
  RPCRetryPolicy{retry_after_secs}), `ok` (the SDK's retry of it), `capacity` (RESOURCE_EXHAUSTED
  without a retry policy); they are the first creates this script makes (a create from an
  unknown image fails at ImageFromId, before any create).

The last line printed is `CONTRACT OK {json}` for the Rust test to check against the fake's records.
"""

import faulthandler
import json
import os
import re
import sys
import time
import uuid

faulthandler.dump_traceback_later(150, exit=True)  # never hang the Rust test

# The V1 sandbox calls, the ones sandgate speaks (see above).
os.environ["MODAL_SANDBOX_V2"] = "0"
os.environ["MODAL_USE_LEGACY_FILESYSTEM_SNAPSHOT"] = "1"

import modal
from modal.exception import (
    AuthError,
    NotFoundError,
    ResourceExhaustedError,
    SandboxTerminatedError,
)

APP_NAME = "sandgate-contract"
BASE_IMAGE = "im-fake"
TAGS = {"sandgate_sandbox": "sb-contract", "sandgate_attempt": "a1"}
V1_SANDBOX_ID = re.compile(r"sb-[0-9A-Za-z]{22}")


def check(cond, what):
    if not cond:
        print(f"CONTRACT FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def sandbox_id_ok(sb):
    sid = sb.object_id
    check(sid.startswith("sb-"), f"sandbox id {sid!r}")
    # Sandbox.from_id and Sandbox.list pick the backend from the id's shape.
    check(bool(V1_SANDBOX_ID.fullmatch(sid)), f"sandbox id {sid!r} has not the V1 shape")
    return sid


def run(sb, *args, stdin=None, text=True, **kw):
    """exec, feed stdin (closing it), and collect (stdout, stderr, exit code)."""
    p = sb.exec(*args, text=text, **kw)
    if stdin is not None:
        p.stdin.write(stdin)
        p.stdin.write_eof()
        p.stdin.drain()
    out = p.stdout.read()
    err = p.stderr.read()
    code = p.wait()
    check(p.returncode == code, f"returncode {p.returncode} != wait() {code}")
    return out, err, code


def main():
    expected = os.environ.get("MODAL_SDK_EXPECTED_VERSION")
    version = modal.__version__
    if expected:
        check(version == expected, f"SDK version {version} != {expected}")
    for var in ("MODAL_SERVER_URL", "MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"):
        check(os.environ.get(var), f"{var} is not set")
    run_id = uuid.uuid4().hex[:12]

    # 1. A wrong token: the fake answers UNAUTHENTICATED, which the SDK raises as AuthError (no retry).
    bad = modal.Client.from_credentials("ak-wrong", "as-wrong")
    try:
        modal.App.lookup(APP_NAME, create_if_missing=True, client=bad)
        check(False, "a wrong token was accepted")
    except AuthError:
        pass

    # 2. The App (AppGetOrCreate with CREATE_IF_MISSING), idempotent by name.
    app = modal.App.lookup(APP_NAME, create_if_missing=True)
    check(app.app_id and app.app_id.startswith("ap-"), f"app id {app.app_id!r}")
    again = modal.App.lookup(APP_NAME, create_if_missing=True)
    check(again.app_id == app.app_id, f"AppGetOrCreate twice: {again.app_id} != {app.app_id}")

    # 3. The base image by id: lazy, hydrated with ImageFromId by the first Sandbox.create.
    image = modal.Image.from_id(BASE_IMAGE)

    # An unknown image id: ImageFromId answers NOT_FOUND.
    try:
        modal.Sandbox.create("sleep", "infinity", app=app, image=modal.Image.from_id("im-doesnotexist"))
        check(False, "a sandbox was created from an unknown image")
    except NotFoundError:
        pass

    # Rate limits, the first sandbox creates of the run (the Rust test scripts the fake's next
    # creates as rate_limit, ok, capacity). RESOURCE_EXHAUSTED carrying an RPCRetryPolicy is
    # retried by the SDK after retry_after_secs (same x-idempotency-key, x-throttle-retry-attempt
    # 1), and the retry makes the sandbox ...
    t0 = time.monotonic()
    throttled = modal.Sandbox.create("sleep", "infinity", app=app, image=image, timeout=300)
    waited = time.monotonic() - t0
    throttled_id = sandbox_id_ok(throttled)
    check(waited >= 0.1, f"the throttled create returned after {waited:.2f}s")
    throttled.terminate()
    # ... while RESOURCE_EXHAUSTED without a retry policy is not retried: ResourceExhaustedError.
    try:
        modal.Sandbox.create("sleep", "infinity", app=app, image=image, timeout=300)
        check(False, "a create refused for capacity succeeded")
    except ResourceExhaustedError:
        pass

    # 4. Create: V1 stores the env as a Secret (SecretGetOrCreate, ANONYMOUS_OWNED_BY_APP) and sends
    #    SandboxCreate with its id in definition.secret_ids, the outbound allowlist in
    #    definition.network_access, resources and timeout_secs, then polls SandboxGetTaskId until the
    #    task id is there.
    sb = modal.Sandbox.create(
        "sleep",
        "infinity",
        app=app,
        image=image,
        env={"CONTRACT_ENV": "from-create"},
        outbound_cidr_allowlist=["203.0.113.7/32"],
        timeout=600,
        cpu=0.5,
        memory=512,
    )
    sid = sandbox_id_ok(sb)
    check(image.object_id == BASE_IMAGE, f"image hydrated as {image.object_id!r}")
    check(sb.returncode is None, f"a new sandbox has returncode {sb.returncode}")
    blocked = modal.Sandbox.create("sleep", "infinity", app=app, image=image, block_network=True, timeout=300)
    blocked_id = sandbox_id_ok(blocked)
    check(blocked_id != sid, "two creates gave the same sandbox")

    # 5. Tags: SandboxTagsSet replaces the whole set, SandboxTagsGet reads it back.
    sb.set_tags(TAGS)
    check(sb.get_tags() == TAGS, f"tags {sb.get_tags()}")

    # 6. exec through the task command router: stdout, stderr, exit code, env, workdir.
    _, _, code = run(sb, "mkdir", "-p", "/root/work")
    check(code == 0, f"mkdir exit {code}")
    out, err, code = run(
        sb,
        "sh",
        "-c",
        "echo out; echo err >&2; echo $CONTRACT_ENV $EXTRA; exit 3",
        env={"EXTRA": "from-exec"},
    )
    check(code == 3, f"exit code {code}")
    check(out == "out\nfrom-create from-exec\n", f"stdout {out!r}")
    check(err == "err\n", f"stderr {err!r}")
    exec_out = out
    # The fake's sandbox root is a host directory, so pwd shows where /root is on the host.
    out, _, code = run(sb, "pwd", workdir="/root/work")
    check(code == 0 and out.rstrip("\n").endswith("/root/work"), f"workdir {out!r}")

    # stdin in one write (data + EOF in one TaskExecStdinWrite) ...
    out, _, code = run(sb, "cat", stdin=b"hello stdin\n")
    check(out == "hello stdin\n" and code == 0, f"cat one write: {out!r} {code}")
    # ... and in two (offset 0 then offset 2, the EOF on its own).
    p = sb.exec("cat")
    p.stdin.write("ab")
    p.stdin.drain()
    p.stdin.write("c\n")
    p.stdin.write_eof()
    p.stdin.drain()
    check(p.stdout.read() == "abc\n", "cat two writes")
    check(p.wait() == 0, "cat exit")
    # Bytes mode, every byte value.
    blob = bytes(range(256)) * 4
    out, _, code = run(sb, "cat", stdin=blob, text=False)
    check(out == blob and code == 0, f"binary round trip ({len(out)} bytes)")

    # 7. Streaming: iterate stdout line by line while the command runs; then a long output in order.
    p = sb.exec("sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.1; done", bufsize=1)
    lines = [line for line in p.stdout]
    check(lines == ["1\n", "2\n", "3\n"], f"streamed lines {lines!r}")
    check(p.wait() == 0, "streaming exit")
    out, _, code = run(sb, "seq", "1", "5000")
    check(out == "".join(f"{i}\n" for i in range(1, 5001)), "long output in order")

    # 8. A file through exec: written from stdin, read back by a later command.
    content = f"written by the SDK {run_id}\n"
    _, err, code = run(sb, "sh", "-c", "cat > /root/contract.txt", stdin=content)
    check(code == 0, f"write exit {code} {err!r}")
    out, _, code = run(sb, "cat", "/root/contract.txt")
    check(out == content and code == 0, f"read back {out!r}")
    out, err, code = run(sb, "cat", "/root/missing.txt")
    check(code != 0 and out == "" and err, f"missing file: {code} {out!r} {err!r}")

    # Reattach by id: SandboxWait(timeout=0), then SandboxGetTaskId and TaskGetCommandRouterAccess
    # since the new handle has no task id or router access yet.
    reattached = modal.Sandbox.from_id(sid)
    check(reattached.object_id == sid and reattached.returncode is None, "from_id")
    out, _, code = run(reattached, "cat", "/root/contract.txt")
    check(out == content and code == 0, f"exec after from_id {out!r}")

    # 9. List by App and tags: SandboxList, paged by before_timestamp until an empty page.
    one_tag = {"sandgate_sandbox": "sb-contract"}
    listed = [s.object_id for s in modal.Sandbox.list(app_id=app.app_id, tags=one_tag)]
    check(listed == [sid], f"list by tag {listed}")
    listed = [s.object_id for s in modal.Sandbox.list(app_id=app.app_id, tags=TAGS)]
    check(listed == [sid], f"list by both tags {listed}")
    listed = [s.object_id for s in modal.Sandbox.list(app_id=app.app_id, tags={"sandgate_sandbox": "nope"})]
    check(listed == [], f"list by another tag {listed}")
    in_app = {s.object_id for s in modal.Sandbox.list(app_id=app.app_id)}
    check({sid, blocked_id} <= in_app, f"list by app {in_app}")

    # 10. Snapshot the filesystem (SandboxSnapshotFs, pinned above; TaskSnapshotFilesystem on the router
    #     or without MODAL_USE_LEGACY_FILESYSTEM_SNAPSHOT) and create a sandbox from the image.
    snap = sb.snapshot_filesystem()
    snapshot_image = snap.object_id
    check(snapshot_image.startswith("im-") and snapshot_image != BASE_IMAGE, f"snapshot {snapshot_image!r}")
    _, _, code = run(sb, "sh", "-c", "echo later > /root/after.txt")
    check(code == 0, "write after the snapshot")
    restored = modal.Sandbox.create("sleep", "infinity", app=app, image=snap, timeout=300)
    restored_id = sandbox_id_ok(restored)
    out, _, code = run(restored, "cat", "/root/contract.txt")
    check(out == content and code == 0, f"file in the restored sandbox {out!r}")
    _, _, code = run(restored, "test", "-e", "/root/after.txt")
    check(code == 1, "a file written after the snapshot leaked into it")
    out, _, _ = run(restored, "sh", "-c", "echo ${CONTRACT_ENV:-unset}")
    check(out == "unset\n", f"env is per sandbox: {out!r}")
    restored.terminate()
    restored.wait(raise_on_termination=False)
    check(restored.returncode == 137, f"restored returncode {restored.returncode}")

    # 11. Terminate (SandboxTerminate), then SandboxWait reports GENERIC_STATUS_TERMINATED (137).
    check(sb.poll() is None, "poll of a running sandbox")
    sb.terminate()
    sb.wait(raise_on_termination=False)
    check(sb.returncode == 137, f"terminated returncode {sb.returncode}")
    check(sb.poll() == 137, "poll after terminate")
    try:
        sb.wait()
        check(False, "wait() of a terminated sandbox did not raise")
    except SandboxTerminatedError:
        pass
    listed = [s.object_id for s in modal.Sandbox.list(app_id=app.app_id, tags=TAGS)]
    check(listed == [], f"a terminated sandbox is listed {listed}")
    blocked.terminate()
    blocked.wait(raise_on_termination=False)
    check(blocked.returncode == 137, f"blocked returncode {blocked.returncode}")

    report = {
        "sdk": version,
        "run": run_id,
        "app": app.app_id,
        "sandbox": sid,
        "blocked": blocked_id,
        "restored": restored_id,
        "throttled": throttled_id,
        "snapshot_image": snapshot_image,
        "exec_stdout": exec_out,
        "file_content": content,
    }
    print("CONTRACT OK " + json.dumps(report))


if __name__ == "__main__":
    main()
