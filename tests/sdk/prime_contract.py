"""Drives the official Prime Intellect Python SDK (prime-sandboxes) against the fake Prime.

Run by tests/it/prime_fake.rs::official_python_sdk_accepts_the_fake with PRIME_API_KEY and
PRIME_API_BASE_URL pointing at the fake (and HOME at a temporary directory: the SDK caches
gateway tokens under ~/.prime). Every step goes through the SDK's own SandboxClient: the
platform API (create, batch status, get, list by label, egress policy, delete) and the
sandbox gateway it reaches with the token from `gatewayAuth` / `POST .../auth` (commands
over the Connect stream with the protobuf codec, upload, download, read-file). The last
line printed is `CONTRACT OK {json}` for the Rust test to check against the fake's records.
"""

import faulthandler
import json
import os
import sys
import tempfile
import uuid

faulthandler.dump_traceback_later(150, exit=True)  # never hang the Rust test

import prime_sandboxes
from prime_sandboxes import (
    APIClient,
    APIError,
    CreateSandboxRequest,
    SandboxClient,
    SandboxFileNotFoundError,
    UnauthorizedError,
)


def check(cond, what):
    if not cond:
        print(f"CONTRACT FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def main():
    expected = os.environ.get("PRIME_SDK_EXPECTED_VERSION")
    version = prime_sandboxes.__version__
    if expected:
        check(version == expected, f"SDK version {version} != {expected}")
    run = uuid.uuid4().hex[:12]

    # A wrong key: the SDK maps the fake's 401 to UnauthorizedError.
    bad = SandboxClient(APIClient(api_key="wrong-key"))
    try:
        bad.list(per_page=1)
        check(False, "a wrong key was accepted")
    except UnauthorizedError:
        pass

    client = SandboxClient(APIClient())
    key = f"contract-{run}"
    request = CreateSandboxRequest(
        name=f"contract-{run}",
        docker_image="python:3.11-slim",
        cpu_cores=1,
        memory_gb=2,
        environment_vars={"CONTRACT_ENV": "from-create"},
        labels=["suite=prime-contract", f"run={run}"],
        network_allowlist=["192.0.2.10", "gw.contract.test"],
        idempotency_key=key,
    )
    sandbox = client.create(request)
    check(sandbox.status in ("PENDING", "PROVISIONING"), f"a new sandbox is {sandbox.status}")
    check(sandbox.network_allowlist == ["192.0.2.10", "gw.contract.test"], "allowlist echoed")
    # The same idempotency key is the same sandbox.
    again = client.create(request)
    check(again.id == sandbox.id, f"idempotency_key: {again.id} != {sandbox.id}")

    # Waits through batch status, then a reachability command through the gateway.
    client.wait_for_creation(sandbox.id, max_attempts=30)
    got = client.get(sandbox.id)
    check(got.status == "RUNNING", f"status {got.status}")
    check(got.vm is True, "the SDK asks for a VM")
    check(got.environment_vars.get("CONTRACT_ENV") == "from-create", "environment_vars")

    # Commands: stdout, stderr, exit codes, env and cwd, over the Connect stream.
    done = client.execute_command(
        sandbox.id,
        "echo out; echo err >&2; echo $CONTRACT_ENV $EXTRA; pwd; exit 3",
        env={"EXTRA": "from-exec"},
    )
    check(done.exit_code == 3, f"exit code {done.exit_code}")
    lines = done.stdout.splitlines()
    check(lines[0] == "out" and lines[1] == "from-create from-exec", f"stdout {done.stdout!r}")
    check(lines[2].endswith("/root"), f"cwd {lines[2]!r}")
    check(done.stderr == "err\n", f"stderr {done.stderr!r}")
    many = client.execute_command(sandbox.id, "seq 1 5000")
    check(many.stdout == "".join(f"{i}\n" for i in range(1, 5001)), "long output in order")
    check(client.execute_command(sandbox.id, "true").exit_code == 0, "exit 0")

    # Files through the gateway.
    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, "contract.txt")
        with open(local, "w") as f:
            f.write("written by the SDK\n")
        up = client.upload_file(sandbox.id, "/root/contract.txt", local)
        check(up.success and up.size == 19, f"upload {up}")
        blob = bytes(range(256))
        client.upload_bytes(sandbox.id, "/root/data/blob.bin", blob, "blob.bin")
        back = os.path.join(tmp, "back.bin")
        client.download_file(sandbox.id, "/root/data/blob.bin", back)
        with open(back, "rb") as f:
            check(f.read() == blob, "download round trip")
    read = client.read_file(sandbox.id, "/root/contract.txt")
    check(read.content == "written by the SDK\n", f"read-file {read.content!r}")
    try:
        client.read_file(sandbox.id, "/root/missing.txt")
        check(False, "a missing file was read")
    except SandboxFileNotFoundError:
        pass
    seen = client.execute_command(sandbox.id, "cat /root/contract.txt")
    check(seen.stdout == "written by the SDK\n", "a command sees the uploaded file")

    # A checkpoint: durable, then restored into a new sandbox, then deleted.
    ckpt = client.checkpoint(sandbox.id)
    durable = client.wait_for_checkpoint(ckpt.id, timeout_seconds=30)
    check(durable.state == "DURABLE" and durable.sandbox_id == sandbox.id, f"checkpoint {durable}")
    restored = client.create(
        CreateSandboxRequest(name=f"restored-{run}", checkpoint_id=ckpt.id, labels=[f"run={run}-r"])
    )
    client.wait_for_creation(restored.id, max_attempts=30)
    again_read = client.read_file(restored.id, "/root/contract.txt")
    check(again_read.content == "written by the SDK\n", "restored from the checkpoint")
    client.delete(restored.id)
    client.delete_checkpoint(ckpt.id)

    # Listing by label, the egress policy.
    listed = client.list(labels=[f"run={run}"])
    check([s.id for s in listed.sandboxes] == [sandbox.id], f"list by label {listed}")
    check(client.list(labels=[f"run={run}", "suite=other"]).total == 0, "labels are ANDed")
    network = client.get_network(sandbox.id)
    check(network.policy.allowlist == ["192.0.2.10", "gw.contract.test"], f"egress {network}")
    check(network.policy.denylist is None, "no denylist")

    # Refusals the SDK checks before sending, and one the server makes.
    try:
        CreateSandboxRequest(
            name="x", docker_image="i", network_allowlist=["a.test"], network_denylist=["b.test"]
        )
        check(False, "allowlist and denylist together")
    except ValueError:
        pass
    try:
        client.get("doesnotexist")
        check(False, "an unknown sandbox was found")
    except APIError as e:
        check("404" in str(e), f"404 expected: {e}")

    # Delete: TERMINATED, and commands are refused afterwards.
    client.delete(sandbox.id)
    check(client.get(sandbox.id).status == "TERMINATED", "deleted")
    active = client.list(labels=[f"run={run}"], exclude_terminated=True)
    check(active.total == 0, "a deleted sandbox is not active")

    report = {
        "sdk": version,
        "run": run,
        "sandbox": sandbox.id,
        "key": key,
        "restored": restored.id,
        "checkpoint": ckpt.id,
    }
    print("CONTRACT OK " + json.dumps(report))


if __name__ == "__main__":
    main()
