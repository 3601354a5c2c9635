package sandgate.creation_test

import rego.v1

import data.sandgate.creation

admit(principal_ws, roles, ws, pool) := {
	"principal": {"principal": "alice", "workspace": principal_ws, "roles": roles},
	"workspace": ws,
	"sandbox": {"id": "sb-1", "workspace": ws, "labels": {}},
	"request": {"labels": {}},
	"pool": {"name": pool, "provider": "sim", "labels": {}},
	"account": {"name": "acct", "provider": "sim", "billing": "good", "labels": {}, "credential_bound": true},
	"attempt": {"number": 1, "previous": []},
}

test_own_workspace_allowed if {
	creation.allow with input as admit("ws-a", [], "ws-a", "p1")
	count(creation.deny) == 0 with input as admit("ws-a", [], "ws-a", "p1")
}

test_other_workspace_denied if {
	not creation.allow with input as admit("ws-b", [], "ws-a", "p1")
	count(creation.deny) == 1 with input as admit("ws-b", [], "ws-a", "p1")
}

test_admin_any_workspace if {
	creation.allow with input as admit("ops", ["admin"], "ws-a", "p1")
	count(creation.deny) == 0 with input as admit("ops", ["admin"], "ws-a", "p1")
}

test_unapproved_pool_denied if {
	count(creation.deny) == 1 with input as admit("ws-a", [], "ws-a", "p2")
		with data.sandgate.workspaces as {"ws-a": {"approved_pools": ["p1"]}}
	count(creation.deny) == 0 with input as admit("ws-a", [], "ws-a", "p1")
		with data.sandgate.workspaces as {"ws-a": {"approved_pools": ["p1"]}}
}
