"""Create a sandbox with routing preferences and watch the create fail over.

Run against a gateway: SANDGATE_URL=http://127.0.0.1:7070 SANDGATE_TOKEN=... python failover.py
Each attempt is printed as it starts and ends (pool, outcome, error class); the create
returns once the sandbox runs, wherever it landed.
"""

import uuid

import sandgate
from sandgate.schema import CreateBody


def show(event: sandgate.Event) -> None:
    attempt = event.attempt
    if attempt is None:  # the `state` and `done` events
        return
    if event.type == "attempt_started":
        print(f"attempt {attempt.seq} on {attempt.pool}: started")
    elif event.type == "attempt_ended":
        print(f"attempt {attempt.seq} on {attempt.pool}: {attempt.outcome} {attempt.error_class or ''}")


with sandgate.Client() as client:
    request: CreateBody = {
        # Cheapest first, then the fastest to start; every pool still must meet the request.
        "routing": {"priorities": ["price", "startup_latency"]},
        "network": {"allow_domains": ["api.github.com"]},
        "labels": {"example": "failover"},
    }
    plan = client.sandboxes.create(request, dry_run=True)
    print("would try:", [step["pool"] for step in plan.plan])
    try:
        sandbox = client.sandboxes.create(
            request, idempotency_key=f"example-{uuid.uuid4()}", on_event=show
        )
    except sandgate.NoEligibleProvider as e:
        for a in e.attempts:
            print(f"{a.pool}: cannot meet {a.unmet_requirements}")
        raise
    print(f"{sandbox.id} runs on {sandbox.info.pool}")
    print(sandbox.exec("uname -sr").stdout, end="")
    sandbox.delete()
