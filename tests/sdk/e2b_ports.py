"""Drives the official E2B Python SDK's `get_host(port)` through sandgate (src/ports).

Run by tests/it/local_ports.rs, which starts sandgate with `[e2b] listen` and its ports
gateway, and passes E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL (the facade), PORTS_CA (the
gateway's CA certificate) and PORTS_LISTENER (the ports listener's address).

A sandbox serves a file on port 8000; `https://{sbx.get_host(8000)}` is fetched with httpx,
trusting only the gateway's CA, with `traffic_access_token` in E2B's header, then without.
Names under the ports domain resolve to the listener (as `*.localhost` does in curl and
browsers). Prints `PORTS OK {json}` as its last line when every step held.
"""

import json
import os
import socket
import ssl
import time

import httpx
from e2b import Sandbox

LISTENER_IP = os.environ["PORTS_LISTENER"].rsplit(":", 1)[0]
_getaddrinfo = socket.getaddrinfo


def resolve(host, *args, **kwargs):
    if isinstance(host, str) and host.endswith(".sandgate.localhost"):
        host = LISTENER_IP
    return _getaddrinfo(host, *args, **kwargs)


socket.getaddrinfo = resolve
tls = ssl.create_default_context(cafile=os.environ["PORTS_CA"])


def check(condition, what):
    if not condition:
        raise AssertionError(what)
    print(f"ok - {what}", flush=True)


sbx = Sandbox.create()
try:
    sbx.commands.run(
        "mkdir -p /tmp/site && echo e2b-port-ok > /tmp/site/index.txt && "
        "cd /tmp/site && exec python3 -m http.server 8000 --bind 127.0.0.1",
        background=True,
    )
    host = sbx.get_host(8000)
    token = sbx.traffic_access_token
    check(bool(token), "the facade gives a traffic access token")
    url = f"https://{host}/index.txt"
    with httpx.Client(verify=tls, trust_env=False, timeout=15) as http:
        deadline = time.time() + 30
        while True:
            answer = http.get(url, headers={"e2b-traffic-access-token": token})
            if answer.status_code == 200 or time.time() > deadline:
                break
            time.sleep(0.2)
        check(answer.status_code == 200, f"{url} answers 200 ({answer.status_code} {answer.text})")
        check(answer.text.strip() == "e2b-port-ok", "with the file the sandbox serves")
        anonymous = http.get(url)
        check(anonymous.status_code == 401, "without the token it is refused")
    print("PORTS OK " + json.dumps({"host": host, "anonymous": anonymous.status_code}))
finally:
    sbx.kill()
