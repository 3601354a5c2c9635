"""Hand an agent an exec-only capability on one sandbox, for fifteen minutes.

The agent's client holds only the delegated token: it can run commands in that sandbox and
nothing else (no files, no delete, no other sandbox), and it stops working when revoked.
"""

import datetime as dt

import sandgate

with sandgate.Client() as client:
    sandbox = client.sandboxes.create({"labels": {"example": "agent"}})
    until = dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=15)
    delegation = sandbox.delegate(["exec"], agent="build-agent", until=until)

    # What the agent gets: the token (e.g. in its environment) and the sandbox id.
    with sandgate.Client.from_delegation(delegation) as agent:
        box = agent.sandbox()
        print(box.exec("echo hello from the agent").stdout, end="")
        try:
            box.files.write("/home/user/notes.txt", "not allowed")
        except sandgate.PermissionDenied as e:
            print("files.write refused:", e.code)

    client.delegations.revoke(delegation.id)
    sandbox.delete()
