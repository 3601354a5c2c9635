"""Store a secret bound to one destination; a sandbox uses it without ever holding it.

The sandbox gets a placeholder in $API_TOKEN; the gateway's proxy swaps in the real secret
only on requests to the credential's destination (EXAMPLE_HOST, default api.github.com, port
EXAMPLE_PORT, default 443). Requests elsewhere carrying the placeholder are refused.
"""

import os

import sandgate

host = os.environ.get("EXAMPLE_HOST", "api.github.com")
port = int(os.environ.get("EXAMPLE_PORT", "443"))
secret = os.environ.get("EXAMPLE_SECRET", "ghp_example_secret")

with sandgate.Client(workspace=os.environ.get("SANDGATE_WORKSPACE")) as client:
    credential = client.credentials.create(
        "example-api",
        secret=sandgate.Secret(secret),
        destinations=[{"host": host, "ports": [port]}],
        apply={"type": "header", "name": "authorization", "template": "Bearer {secret}"},
        placeholder_env="API_TOKEN",
    )
    print(credential)  # metadata only: the secret never comes back
    sandbox = client.sandboxes.create(
        {"credentials": ["example-api"], "network": {"allow_domains": [host]}}
    )
    print("sandbox sees:", sandbox.exec("echo $API_TOKEN").stdout, end="")
    out = sandbox.exec(f'curl -s -H "Authorization: Bearer $API_TOKEN" https://{host}:{port}/')
    print("origin answered:", out.stdout[:200])
    sandbox.delete()
    client.credentials.delete("example-api")
