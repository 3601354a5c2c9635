package sandgate.lifecycle_test

import rego.v1

import data.sandgate.lifecycle

op(principal_ws, roles, ws, operation, labels) := {
	"operation": operation,
	"principal": {"principal": "alice", "workspace": principal_ws, "roles": roles},
	"workspace": ws,
	"sandbox": {"id": "sb-1", "workspace": ws, "labels": labels, "state": "running", "pool": "local"},
}

test_own_workspace_allowed if {
	lifecycle.allow with input as op("ws-a", [], "ws-a", "pause", {})
	count(lifecycle.deny) == 0 with input as op("ws-a", [], "ws-a", "pause", {})
}

test_other_workspace_denied if {
	not lifecycle.allow with input as op("ws-b", [], "ws-a", "stop", {})
	count(lifecycle.deny) == 1 with input as op("ws-b", [], "ws-a", "stop", {})
}

test_protected_sandbox_delete_needs_admin if {
	count(lifecycle.deny) == 1 with input as op("ws-a", [], "ws-a", "delete", {"protected": "true"})
	count(lifecycle.deny) == 0 with input as op("ws-a", [], "ws-a", "stop", {"protected": "true"})
	count(lifecycle.deny) == 0 with input as op("ops", ["admin"], "ws-a", "delete", {"protected": "true"})
}
