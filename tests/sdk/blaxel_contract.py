"""Drives the official Blaxel Python SDK (PyPI `blaxel`) against the fake Blaxel.

Run by tests/it/blaxel_fake.rs::official_python_sdk_accepts_the_fake with BL_API_KEY and
BL_WORKSPACE (read by the SDK itself at import) and BL_FAKE_API_URL, the fake's control plane.

Pointing the SDK at the fake: the SDK has no environment variable for its control-plane URL
(`settings.base_url` is fixed to https://api.blaxel.ai/v0, or api.blaxel.dev/v0 with
BL_ENV=dev). Its import runs `autoload()`, which calls `client.with_base_url(settings.base_url)`
on the one shared control-plane client (`blaxel.core.client`); calling `with_base_url` again
with the fake's URL after the import, before any request, re-points every control-plane call.
The data plane needs nothing: the SDK sends process and filesystem calls to each sandbox's
`metadata.url`, which the fake answers with its own address.

Every step goes through the SDK's own objects (SandboxInstance, its `process` and `fs`); the
last line printed is `CONTRACT OK {json}` for the Rust test to check against the fake's records.
"""

import asyncio
import json
import os
import sys
import uuid
import faulthandler

faulthandler.dump_traceback_later(150, exit=True)  # never hang the Rust test

import blaxel
from blaxel.core import SandboxAPIError, SandboxInstance, client


def check(cond, what):
    if not cond:
        print(f"CONTRACT FAILED: {what}", file=sys.stderr)
        sys.exit(1)


async def contract(run):
    # A sandbox with labels, envs, a region and network settings, ready when created.
    name = f"contract-{run}"
    sandbox = await SandboxInstance.create(
        {
            "name": name,
            "image": "blaxel/base-image:latest",
            "memory": 2048,
            "region": "us-pdx-1",
            "envs": [{"name": "CONTRACT_ENV", "value": "from-create"}],
            "labels": {"suite": "blaxel-contract", "run": run},
            "network": {
                "proxy": {"allowedDomains": ["gw.contract.test"]},
                "firewall": {"rulesets": ["proxy"]},
            },
        }
    )
    check(sandbox.metadata.name == name, "the sandbox's name")
    check(str(sandbox.status) == "DEPLOYED", f"created status {sandbox.status}")
    check(sandbox.metadata.labels["run"] == run, "labels read back")
    url = sandbox.metadata.url
    check(isinstance(url, str) and url.startswith("http"), f"metadata.url {url!r}")

    # A second create of the same name: 409, and createIfNotExist answers the same sandbox.
    try:
        await SandboxInstance.create({"name": name})
        check(False, "a name in use was accepted")
    except SandboxAPIError as e:
        check(e.status_code == 409, f"a name in use: {e.status_code}")
    same = await SandboxInstance.create_if_not_exists({"name": name})
    check(same.metadata.name == name, "createIfNotExist answers the existing sandbox")

    # Read back and list (cursor pages with Blaxel-Version).
    got = await SandboxInstance.get(name)
    check(got.spec.network.proxy.allowed_domains == ["gw.contract.test"], "network read back")
    page = await SandboxInstance.list(limit=50)
    names = [s.metadata.name async for s in page.auto_paging_iter()]
    check(name in names, f"{name} listed: {names}")

    # Commands: waited (JSON), streamed (NDJSON), long-polled, their logs.
    done = await sandbox.process.exec(
        {"command": "echo $CONTRACT_ENV; echo to-err >&2; exit 3", "wait_for_completion": True}
    )
    check(str(done.status) == "failed", f"exit 3 is failed: {done.status}")
    check(done.exit_code == 3, f"exit code {done.exit_code}")
    check(done.stdout == "from-create\n", f"stdout {done.stdout!r}")
    check(done.stderr == "to-err\n", f"stderr {done.stderr!r}")
    seen = []
    streamed = await sandbox.process.exec(
        {
            "command": "echo one; sleep 0.2; echo two >&2; sleep 0.2; echo three",
            "env": {"A": "b"},
            "wait_for_completion": True,
            "on_stdout": lambda text: seen.append(("out", text)),
            "on_stderr": lambda text: seen.append(("err", text)),
        }
    )
    check(streamed.exit_code == 0, f"streamed exit {streamed.exit_code}")
    # Each line arrives on its own (the sleeps), in the order it was written.
    check(
        seen == [("out", "one\n"), ("err", "two\n"), ("out", "three\n")],
        f"streamed output {seen!r}",
    )
    started = await sandbox.process.exec({"name": "sleeper", "command": "sleep 0.3; echo woke"})
    check(str(started.status) == "running", f"started {started.status}")
    waited = await sandbox.process.wait("sleeper", max_wait=10000, interval=100)
    check(str(waited.status) == "completed", f"waited {waited.status}")
    logs = await sandbox.process.logs("sleeper", "stdout")
    check(logs == "woke\n", f"logs {logs!r}")
    killable = await sandbox.process.exec({"name": "forever", "command": "sleep 30"})
    await sandbox.process.kill("forever")
    killed = await sandbox.process.wait("forever", max_wait=10000, interval=100)
    check(str(killed.status) == "killed", f"killed {killed.status}")
    check(killable.name == "forever", "the process name")

    # Files: text, binary, a directory listing, removal, a missing file.
    await sandbox.fs.write("/home/user/contract.txt", "written by the SDK\n")
    check(await sandbox.fs.read("/home/user/contract.txt") == "written by the SDK\n", "read text")
    blob = bytes(range(256))
    await sandbox.fs.write_binary("/home/user/blob.bin", blob)
    check(await sandbox.fs.read_binary("/home/user/blob.bin") == blob, "read bytes")
    await sandbox.fs.mkdir("/home/user/dir/sub")
    listing = await sandbox.fs.ls("/home/user")
    files = sorted(f.name for f in listing.files)
    dirs = sorted(d.name for d in listing.subdirectories)
    check(files == ["blob.bin", "contract.txt"], f"files {files}")
    check(dirs == ["dir"], f"dirs {dirs}")
    await sandbox.fs.write("/home/user/gone.txt", "x")
    await sandbox.fs.rm("/home/user/gone.txt")
    try:
        await sandbox.fs.read("/home/user/gone.txt")
        check(False, "a removed file was read")
    except Exception as e:  # the SDK's ResponseError
        check(getattr(e, "status", None) == 404, f"a removed file: {e!r}")

    # Delete: DELETING, then TERMINATED; a second delete is a 404.
    deleted = await SandboxInstance.delete(name)
    check(str(deleted.status) in ("DELETING", "TERMINATED"), f"deleted {deleted.status}")
    for _ in range(100):
        state = await SandboxInstance.get(name)
        if str(state.status) == "TERMINATED":
            break
        await asyncio.sleep(0.05)
    check(str(state.status) == "TERMINATED", f"terminated {state.status}")
    try:
        await SandboxInstance.delete(name)
        check(False, "a terminated sandbox was deleted again")
    except SandboxAPIError as e:
        check(e.status_code == 404, f"a second delete: {e.status_code}")
    return {"sandbox": name, "run": run}


def main():
    expected = os.environ.get("BLAXEL_SDK_EXPECTED_VERSION")
    version = blaxel.__version__
    if expected:
        check(version == expected, f"SDK version {version} != {expected}")
    client.with_base_url(os.environ["BL_FAKE_API_URL"])
    run = uuid.uuid4().hex[:12]
    report = asyncio.run(contract(run))
    report["sdk"] = version
    print("CONTRACT OK " + json.dumps(report))


if __name__ == "__main__":
    main()
