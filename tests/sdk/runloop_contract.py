"""Drives the official Runloop Python SDK (runloop-api-client) against the fake Runloop.

Run by tests/it/runloop_fake.rs::official_python_sdk_accepts_the_fake with RUNLOOP_API_KEY and
RUNLOOP_BASE_URL pointing at the fake. Every step goes through the SDK's own client (its
high-level RunloopSDK where it has one, else the generated `api` resources); the last line
printed is `CONTRACT OK {json}` for the Rust test to check against the fake's records.
"""

import json
import os
import sys
import threading
import uuid
import faulthandler
faulthandler.dump_traceback_later(150, exit=True)  # never hang the Rust test

import runloop_api_client
from runloop_api_client import (
    AuthenticationError,
    BadRequestError,
    NotFoundError,
    Runloop,
    RunloopSDK,
)


def check(cond, what):
    if not cond:
        print(f"CONTRACT FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def main():
    expected = os.environ.get("RUNLOOP_SDK_EXPECTED_VERSION")
    version = runloop_api_client.__version__
    if expected:
        check(version == expected, f"SDK version {version} != {expected}")
    base_url = os.environ["RUNLOOP_BASE_URL"]
    key = os.environ["RUNLOOP_API_KEY"]
    run = uuid.uuid4().hex[:12]

    # A wrong key: the SDK maps the fake's 401 to AuthenticationError.
    bad = Runloop(bearer_token="wrong-key", base_url=base_url, max_retries=0)
    try:
        bad.devboxes.list(limit=1)
        check(False, "a wrong key was accepted")
    except AuthenticationError:
        pass

    sdk = RunloopSDK(bearer_token=key, base_url=base_url)
    api = sdk.api

    # Network policy: create, read back, list by name.
    policy = sdk.network_policy.create(
        name=f"contract-gw-{run}",
        allow_all=False,
        allowed_hostnames=["gw.contract.test"],
        allowed_cidrs=[{"cidr": "192.0.2.10/32", "ports": [{"port": 8443, "protocol": "TCP"}]}],
        description="only the gateway",
    )
    info = policy.get_info()
    check(info.egress.allow_all is False, "policy allow_all")
    check(info.egress.allowed_hostnames == ["gw.contract.test"], "policy hostnames")
    check(info.egress.allowed_cidrs[0].cidr == "192.0.2.10/32", "policy cidr")
    listed = [p.id for p in sdk.network_policy.list(name=f"contract-gw-{run}")]
    check(policy.id in listed, "policy listed by name")
    try:
        api.network_policies.create(name="bad", allowed_cidrs=[{"cidr": "192.0.2.10/24"}])
        check(False, "a non-canonical CIDR was accepted")
    except BadRequestError:
        pass

    # A devbox with metadata, environment and the policy, awaited running by the SDK.
    devbox = sdk.devbox.create(
        name=f"contract-{run}",
        metadata={"suite": "runloop-contract", "run": run},
        environment_variables={"CONTRACT_ENV": "from-create"},
        launch_parameters={
            "network_policy_id": policy.id,
            "resource_size_request": "SMALL",
            "keep_alive_time_seconds": 600,
        },
    )
    view = devbox.get_info()
    check(view.status == "running", f"status {view.status}")
    check(view.metadata == {"suite": "runloop-contract", "run": run}, "metadata")
    check(view.launch_parameters.network_policy_id == policy.id, "policy attached")

    # Commands: streamed output, exit codes, the environment, the home directory.
    out_chunks, err_chunks = [], []
    result = devbox.cmd.exec(
        "echo hello; echo \"$CONTRACT_ENV\"; pwd; echo oops >&2",
        stdout=out_chunks.append,
        stderr=err_chunks.append,
    )
    check(result.exit_code == 0, f"exit code {result.exit_code}")
    stdout = result.stdout()
    check(stdout.startswith("hello\nfrom-create\n"), f"stdout {stdout!r}")
    check(stdout.rstrip("\n").endswith("/home/user"), f"pwd {stdout!r}")
    check(result.stderr() == "oops\n", f"stderr {result.stderr()!r}")
    check("".join(out_chunks) == stdout, f"streamed stdout {out_chunks!r}")
    check("".join(err_chunks) == "oops\n", f"streamed stderr {err_chunks!r}")
    failing = devbox.cmd.exec("echo bad >&2; exit 3")
    check(failing.exit_code == 3 and failing.failed, f"non-zero exit {failing.exit_code}")

    # execute with a command_id: the same id is the same execution.
    command_id = str(uuid.uuid4())
    first = api.devboxes.execute(devbox.id, command="echo once", command_id=command_id)
    again = api.devboxes.execute(devbox.id, command="echo once", command_id=command_id)
    check(first.execution_id == again.execution_id, "command_id idempotency")
    check(again.status == "completed" and again.stdout == "once\n", f"execute {again}")

    # An async execution, its raw SSE stream, and a kill.
    started = api.devboxes.execute_async(devbox.id, command="for i in 1 2 3; do echo line$i; done")
    done = api.devboxes.executions.await_completed(started.execution_id, devbox.id)
    check(done.exit_status == 0, "async exit")
    streamed = "".join(
        c.output
        for c in api.devboxes.executions.stream_stdout_updates(started.execution_id, devbox_id=devbox.id)
    )
    check(streamed == "line1\nline2\nline3\n", f"SSE stdout {streamed!r}")
    tail = "".join(
        c.output
        for c in api.devboxes.executions.stream_stdout_updates(
            started.execution_id, devbox_id=devbox.id, offset="6"
        )
    )
    check(tail == "line2\nline3\n", f"SSE from offset {tail!r}")
    sleeper = devbox.cmd.exec_async("sleep 30")
    sleeper.kill()
    killed = sleeper.result()
    check(killed.exit_code is not None and killed.exit_code != 0, f"killed exit {killed.exit_code}")

    # Files: text and binary, relative to /home/user and absolute.
    devbox.file.write(file_path="contract.txt", contents="written by the SDK\n")
    check(devbox.file.read(file_path="/home/user/contract.txt") == "written by the SDK\n", "read")
    blob = bytes(range(256))
    devbox.file.upload(path="blob.bin", file=("blob.bin", blob))
    check(devbox.file.download(path="blob.bin") == blob, "binary round trip")
    try:
        devbox.file.read(file_path="../../../etc/passwd")
        check(False, "a path outside the devbox was read")
    except BadRequestError:
        pass
    try:
        devbox.file.read(file_path="missing.txt")
        check(False, "a missing file was read")
    except NotFoundError:
        pass

    # A second devbox through create + await_running (the wait_for_status long poll).
    other = api.devboxes.create(metadata={"suite": "runloop-contract", "run": run, "n": "2"})
    check(other.status in ("provisioning", "initializing"), f"other starts {other.status}")
    other = api.devboxes.await_running(other.id)
    check(other.status == "running", "other running")

    # List: paged one at a time by the SDK's auto-pagination (starting_after).
    ids = [d.id for d in api.devboxes.list(limit=1)]
    check(devbox.id in ids and other.id in ids, "both listed")
    check(len(ids) == len(set(ids)), "no page repeats")
    running_ids = [d.id for d in api.devboxes.list(status="running")]
    check(devbox.id in running_ids, "status filter")

    # Suspend and resume.
    suspended = devbox.suspend()
    check(suspended.status == "suspended", f"suspended {suspended.status}")
    resumed = devbox.resume()
    check(resumed.status == "running", f"resumed {resumed.status}")
    check(devbox.file.read(file_path="contract.txt") == "written by the SDK\n", "disk kept")

    # A disk snapshot and a devbox restored from it.
    snap = api.devboxes.snapshot_disk(devbox.id, name=f"contract-{run}")
    restored = api.devboxes.create_and_await_running(snapshot_id=snap.id)
    check(
        api.devboxes.read_file_contents(restored.id, file_path="contract.txt") == "written by the SDK\n",
        "restored file",
    )

    # Shut everything down.
    for box in (devbox.id, other.id, restored.id):
        down = api.devboxes.shutdown(box)
        check(down.status == "shutdown", f"shutdown {down.status}")
    try:
        api.devboxes.retrieve("dbx_does_not_exist")
        check(False, "an unknown devbox was found")
    except NotFoundError:
        pass

    report = {
        "sdk": version,
        "run": run,
        "devbox": devbox.id,
        "other": other.id,
        "restored": restored.id,
        "snapshot": snap.id,
        "policy": policy.id,
        "command_id_execution": first.execution_id,
    }
    print("CONTRACT OK " + json.dumps(report))


if __name__ == "__main__":
    main()
