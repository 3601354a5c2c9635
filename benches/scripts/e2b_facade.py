# Run against `sudo sandgate serve --e2b-listen 127.0.0.1:3999` on the embedded defaults, with
# E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL, SANDGATE_API, SANDGATE_TOKEN set (see README).
"""Median latency of one short command through the E2B facade (official SDK) and through
sandgate's own /v1 exec (requests, NDJSON), same server, same sandbox pool."""
import json, os, statistics, sys, time
import requests
from e2b import Sandbox

N = int(os.environ.get("N", "30"))
api = os.environ["SANDGATE_API"]; token = os.environ["SANDGATE_TOKEN"]
s = requests.Session(); s.trust_env = False
sbx = Sandbox.create(timeout=600)
for _ in range(3): sbx.commands.run("true")
facade = []
for _ in range(N):
    t = time.perf_counter(); sbx.commands.run("true"); facade.append((time.perf_counter() - t) * 1000)
v1 = []
for _ in range(N):
    t = time.perf_counter()
    r = s.post(f"{api}/v1/sandboxes/{sbx.sandbox_id}/exec", headers={"Authorization": f"Bearer {token}"},
               json={"argv": ["/bin/bash", "-l", "-c", "true"]})
    assert r.status_code == 200 and '"exit"' in r.text, r.text
    v1.append((time.perf_counter() - t) * 1000)
create_f = []
for _ in range(5):
    t = time.perf_counter(); x = Sandbox.create(timeout=60); create_f.append((time.perf_counter() - t) * 1000); x.kill()
create_v = []
for _ in range(5):
    t = time.perf_counter()
    r = s.post(f"{api}/v1/sandboxes", headers={"Authorization": f"Bearer {token}"}, json={"ttl_secs": 60})
    assert r.status_code == 201, r.text
    create_v.append((time.perf_counter() - t) * 1000)
    s.delete(f"{api}/v1/sandboxes/{r.json()['id']}", headers={"Authorization": f"Bearer {token}"})
sbx.kill()
med = statistics.median
print(json.dumps({"n": N, "exec_facade_ms": round(med(facade), 2), "exec_v1_ms": round(med(v1), 2),
                  "exec_ratio": round(med(facade) / med(v1), 2),
                  "create_facade_ms": round(med(create_f), 1), "create_v1_ms": round(med(create_v), 1)}))
