"""Drives the official Daytona Python SDK against the fake Daytona of tests/it/common/fakes/daytona.rs.

Run by tests/it/daytona_fake.rs, which starts the fake and passes it in the environment:
DAYTONA_API_KEY and DAYTONA_API_URL (`<fake>/api`, the control plane). The toolbox is
reached the way the SDK always reaches it: through each sandbox's `toolboxProxyUrl`, which
the fake answers as `<fake>/toolbox` (the SDK then calls `<fake>/toolbox/{sandboxId}/...`).

Prints `CONTRACT OK {json}` as its last line when every step held; any failed check
raises and exits non-zero.
"""

import importlib.metadata
import json
import os
import uuid

from daytona import (
    CreateSandboxFromSnapshotParams,
    Daytona,
    DaytonaAuthenticationError,
    DaytonaConfig,
    DaytonaError,
    DaytonaNotFoundError,
    DaytonaTimeoutError,
    ListSandboxesQuery,
    SandboxState,
)


def check(condition, what):
    if not condition:
        raise AssertionError(what)
    print(f"ok - {what}", flush=True)


def raises(kind, what, call):
    try:
        call()
    except kind as e:
        check(True, f"{what}: {type(e).__name__}")
        return e
    raise AssertionError(f"{what}: expected {kind.__name__}")


def main():
    version = importlib.metadata.version("daytona")
    expected = os.environ.get("DAYTONA_SDK_EXPECTED_VERSION")
    print(f"daytona SDK {version}", flush=True)
    if expected:
        check(version == expected, f"the daytona SDK is the pinned {expected}")
    api_url = os.environ["DAYTONA_API_URL"]
    check(api_url.endswith("/api"), "the API is under /api")

    run = uuid.uuid4().hex[:12]
    daytona = Daytona()

    # Control plane: POST /sandbox (answered while still `creating`), then the SDK polls
    # GET /sandbox/{id} until `started`.
    sbx = daytona.create(
        CreateSandboxFromSnapshotParams(
            labels={"suite": "daytona-contract", "run": run},
            env_vars={"CONTRACT_ENV": "from-create"},
            network_block_all=False,
            network_allow_list="192.0.2.10/32",
            auto_stop_interval=0,
        ),
        timeout=60,
    )
    check(bool(sbx.id), f"created sandbox {sbx.id}")
    check(sbx.state == SandboxState.STARTED, f"create waited for started ({sbx.state})")
    check(sbx.labels.get("run") == run, "labels echoed")
    check(sbx.network_allow_list == "192.0.2.10/32", "networkAllowList echoed")
    check(sbx.network_block_all is False, "networkBlockAll echoed")
    check(sbx.toolbox_proxy_url.endswith("/toolbox"), f"toolboxProxyUrl {sbx.toolbox_proxy_url}")

    again = daytona.get(sbx.id)
    check(again.state == SandboxState.STARTED, "get: started")
    check(again.env.get("CONTRACT_ENV") == "from-create", "get: env echoed")
    check(again.user == "daytona", "get: the default user")

    # Toolbox: process/execute runs for real, output buffered, exit code returned.
    r = sbx.process.exec("echo hello")
    check(r.exit_code == 0 and r.result == "hello\n", f"exec echo: {r.exit_code} {r.result!r}")
    r = sbx.process.exec('echo "$CONTRACT_ENV $PER_COMMAND"', env={"PER_COMMAND": "per-command"})
    check(r.result == "from-create per-command\n", f"exec env: {r.result!r}")
    r = sbx.process.exec("echo out; echo err 1>&2; exit 3")
    check(r.exit_code == 3, f"exec exit code 3 ({r.exit_code})")
    check(r.result == "out\nerr\n", f"exec merges stdout and stderr: {r.result!r}")
    raises(DaytonaTimeoutError, "exec past its timeout", lambda: sbx.process.exec("sleep 5", timeout=1))

    # Files: bulk-upload and bulk-download (multipart both ways), list, info, delete.
    home = sbx.get_user_home_dir()
    check(home == "/home/daytona", f"user home {home}")
    sbx.fs.create_folder("contract", "755")
    text = b"hello from the contract\n"
    sbx.fs.upload_file(text, "contract/hello.txt")
    check(sbx.fs.download_file("contract/hello.txt") == text, "upload/download round trip")
    binary = bytes(range(256)) * 64 + b"\r\n--not-a-boundary--\r\n"
    sbx.fs.upload_file(binary, "/home/daytona/contract/deep/er/blob.bin")
    check(sbx.fs.download_file("contract/deep/er/blob.bin") == binary, "binary round trip, parents created")
    names = sorted(f.name for f in sbx.fs.list_files("contract"))
    check(names == ["deep", "hello.txt"], f"list_files: {names}")
    info = sbx.fs.get_file_info("contract/hello.txt")
    check(info.size == len(text) and not info.is_dir, "get_file_info")
    r = sbx.process.exec("cat hello.txt", cwd="/home/daytona/contract")
    check(r.result == text.decode(), "exec in a cwd sees the uploaded file")
    sbx.fs.delete_file("contract/hello.txt")
    raises(DaytonaError, "download of a deleted file", lambda: sbx.fs.download_file("contract/hello.txt"))
    raises(DaytonaError, "delete of a directory without recursive", lambda: sbx.fs.delete_file("contract"))

    # Listing by labels (JSON in `labels`), following nextCursor.
    other = daytona.create(
        CreateSandboxFromSnapshotParams(labels={"suite": "daytona-contract", "run": run, "role": "other"}),
        timeout=60,
    )
    both = sorted(s.id for s in daytona.list(ListSandboxesQuery(labels={"run": run}, limit=1)))
    check(both == sorted([sbx.id, other.id]), "list by label, one per page")
    only = [s.id for s in daytona.list(ListSandboxesQuery(labels={"run": run, "role": "other"}))]
    check(only == [other.id], "list by two labels")
    none = list(daytona.list(ListSandboxesQuery(labels={"run": "no-such-run"})))
    check(none == [], "list matching nothing")

    # Lifecycle: stop, the toolbox refuses, start, the toolbox answers again.
    sbx.stop(timeout=30)
    check(sbx.state == SandboxState.STOPPED, "stop waited for stopped")
    raises(DaytonaError, "exec in a stopped sandbox", lambda: sbx.process.exec("echo no"))
    sbx.start(timeout=30)
    check(sbx.state == SandboxState.STARTED, "start waited for started")
    r = sbx.process.exec("cat contract/deep/er/blob.bin | wc -c")
    check(r.result.strip() == str(len(binary)), "files survive stop/start")

    # Authentication, in the API's error shape.
    stranger = Daytona(DaytonaConfig(api_key="wrong-key", api_url=api_url))
    raises(DaytonaAuthenticationError, "a wrong API key", lambda: stranger.get(sbx.id))

    # Delete: fire-and-forget, and waiting for destroyed.
    daytona.delete(other)
    daytona.delete(sbx, wait=True)
    raises(DaytonaNotFoundError, "get of a deleted sandbox", lambda: daytona.get(sbx.id))
    left = [s.id for s in daytona.list(ListSandboxesQuery(labels={"run": run}))]
    check(left == [], f"nothing left listed: {left}")

    print("CONTRACT OK " + json.dumps({"sdk": version, "sandbox": sbx.id, "other": other.id, "run": run}))


if __name__ == "__main__":
    main()
