package sandgate.action_test

import rego.v1

import data.sandgate.action

act(principal_ws, roles, ws, operation) := {
	"operation": operation,
	"principal": {"principal": "alice", "workspace": principal_ws, "roles": roles},
	"workspace": ws,
	"sandbox": {"id": "sb-1", "workspace": ws, "labels": {}, "state": "running", "pool": "local"},
	"exec": {"argv": ["/usr/bin/curl", "-s", "https://example.com"], "cwd": "/home/user"},
}

test_own_workspace_exec_allowed if {
	action.allow with input as act("ws-a", [], "ws-a", "exec")
	count(action.deny) == 0 with input as act("ws-a", [], "ws-a", "exec")
}

test_other_workspace_denied if {
	not action.allow with input as act("ws-b", [], "ws-a", "files.read")
	count(action.deny) == 1 with input as act("ws-b", [], "ws-a", "files.read")
}

test_admin_any_workspace if {
	action.allow with input as act("ops", ["admin"], "ws-a", "files.write")
	count(action.deny) == 0 with input as act("ops", ["admin"], "ws-a", "files.write")
}

test_blocked_operation_denied_even_for_own_workspace if {
	count(action.deny) == 1 with input as act("ws-a", [], "ws-a", "files.write")
		with data.sandgate.workspaces as {"ws-a": {"blocked_operations": ["files.write"]}}
	count(action.deny) == 0 with input as act("ws-a", [], "ws-a", "files.read")
		with data.sandgate.workspaces as {"ws-a": {"blocked_operations": ["files.write"]}}
}

test_blocked_program_denied if {
	count(action.deny) == 1 with input as act("ws-a", [], "ws-a", "exec")
		with data.sandgate.workspaces as {"ws-a": {"blocked_programs": ["curl"]}}
	count(action.deny) == 0 with input as act("ws-a", [], "ws-a", "exec")
		with data.sandgate.workspaces as {"ws-a": {"blocked_programs": ["wget"]}}
}

test_suspended_principal_denied_even_through_a_delegation if {
	delegated := object.union(act("ws-a", [], "ws-a", "exec"), {"delegation": {"id": "dg-1", "agent": "bot", "actions": ["exec"]}})
	count(action.deny) == 1 with input as delegated
		with data.sandgate.suspended_principals as ["alice"]
	count(action.deny) == 0 with input as delegated
		with data.sandgate.suspended_principals as ["bob"]
}

test_blocked_program_denied_on_a_logged_record if {
	logged := object.union(object.remove(act("ws-a", [], "ws-a", "exec"), ["exec"]), {"exec": {"argv0": "/usr/bin/curl", "argc": 3, "argv_sha256": "00"}})
	count(action.deny) == 1 with input as logged
		with data.sandgate.workspaces as {"ws-a": {"blocked_programs": ["curl"]}}
}

test_pty_blocked_while_exec_is_allowed if {
	blocked := {"ws-a": {"blocked_operations": ["pty"]}}
	count(action.deny) == 0 with input as act("ws-a", [], "ws-a", "exec")
		with data.sandgate.workspaces as blocked
	action.deny == {"operation pty is blocked in workspace ws-a"} with input as act("ws-a", [], "ws-a", "pty")
		with data.sandgate.workspaces as blocked
	count(action.deny) == 0 with input as act("ws-a", [], "ws-a", "stdin")
		with data.sandgate.workspaces as blocked
}

test_blocked_program_refuses_its_terminal_session_too if {
	shell := object.union(act("ws-a", [], "ws-a", "pty"), {"exec": {"argv": ["/bin/bash"], "cwd": null}})
	action.deny == {"program bash is blocked in workspace ws-a"} with input as shell
		with data.sandgate.workspaces as {"ws-a": {"blocked_programs": ["bash"]}}
	count(action.deny) == 0 with input as shell
		with data.sandgate.workspaces as {"ws-a": {"blocked_programs": ["curl"]}}
}

test_stdin_blocked_alone if {
	blocked := {"ws-a": {"blocked_operations": ["stdin"]}}
	count(action.deny) == 1 with input as act("ws-a", [], "ws-a", "stdin")
		with data.sandgate.workspaces as blocked
	count(action.deny) == 0 with input as act("ws-a", [], "ws-a", "exec")
		with data.sandgate.workspaces as blocked
}

test_exec_users_restricts_who_commands_run_as if {
	as_root := object.union(act("ws-a", [], "ws-a", "exec"), {"exec": {"argv": ["id"], "user": "root"}})
	as_default := object.union(act("ws-a", [], "ws-a", "exec"), {"exec": {"argv": ["id"], "user": null}})
	count(action.deny) == 1 with input as as_root
		with data.sandgate.workspaces as {"ws-a": {"exec_users": ["user"]}}
	count(action.deny) == 0 with input as as_default
		with data.sandgate.workspaces as {"ws-a": {"exec_users": ["user"]}}
	count(action.deny) == 0 with input as as_root
		with data.sandgate.workspaces as {"ws-a": {"exec_users": ["user", "root"]}}
	count(action.deny) == 0 with input as as_root
}

port_request(principal, ws, number, public) := {
	"operation": "ports",
	"principal": principal,
	"workspace": "ws-a",
	"sandbox": {"id": "sb-1", "workspace": "ws-a", "labels": {}, "state": "running", "pool": "local"},
	"port": {"number": number, "public": public},
}

anonymous := {"principal": "anonymous", "workspace": "", "roles": []}

port_token := {"principal": "port-token", "workspace": "ws-a", "roles": []}

test_a_workspace_principal_opens_any_port if {
	alice := {"principal": "alice", "workspace": "ws-a", "roles": []}
	action.allow with input as port_request(alice, "ws-a", 8000, false)
	count(action.deny) == 0 with input as port_request(alice, "ws-a", 8000, false)
	bob := {"principal": "bob", "workspace": "ws-b", "roles": []}
	count(action.deny) == 1 with input as port_request(bob, "ws-a", 8000, false)
}

test_a_port_is_public_only_when_the_workspace_lists_it if {
	public := {"ws-a": {"public_ports": [3000]}}
	action.allow with input as port_request(anonymous, "ws-a", 3000, true) with data.sandgate.workspaces as public
	count(action.deny) == 0 with input as port_request(anonymous, "ws-a", 3000, true) with data.sandgate.workspaces as public
	not action.allow with input as port_request(anonymous, "ws-a", 8000, true) with data.sandgate.workspaces as public
	count(action.deny) == 1 with input as port_request(anonymous, "ws-a", 8000, true) with data.sandgate.workspaces as public
	not action.allow with input as port_request(anonymous, "ws-a", 3000, true)
	# Not public: `public` is what a tokenless request asks, never granted by saying false.
	not action.allow with input as port_request(anonymous, "ws-a", 3000, false) with data.sandgate.workspaces as public
}

test_blocking_ports_closes_tokens_and_public_ports if {
	blocked := {"ws-a": {"blocked_operations": ["ports"], "public_ports": [3000]}}
	count(action.deny) == 1 with input as port_request(port_token, "ws-a", 8000, false) with data.sandgate.workspaces as blocked
	count(action.deny) == 1 with input as port_request(anonymous, "ws-a", 3000, true) with data.sandgate.workspaces as blocked
	count(action.deny) == 0 with input as port_request(port_token, "ws-a", 8000, false)
}

test_watch_is_its_own_operation if {
	watch := object.union(act("ws-a", [], "ws-a", "watch"), {"file": {"path": "/home/user", "recursive": true}})
	action.allow with input as watch
	count(action.deny) == 0 with input as watch
	# Refused like a read across workspaces.
	not action.allow with input as object.union(act("ws-b", [], "ws-a", "watch"), {"file": {"path": "/home/user", "recursive": false}})
	# Blocked alone: commands and reads go on.
	blocked := {"ws-a": {"blocked_operations": ["watch"]}}
	action.deny == {"operation watch is blocked in workspace ws-a"} with input as watch
		with data.sandgate.workspaces as blocked
	count(action.deny) == 0 with input as act("ws-a", [], "ws-a", "files.read")
		with data.sandgate.workspaces as blocked
	count(action.deny) == 0 with input as act("ws-a", [], "ws-a", "exec")
		with data.sandgate.workspaces as blocked
}
