# Bundled action policy (layer `sandgate.action`): may this principal perform this operation
# inside this sandbox? Evaluated for every exec, terminal session (`pty`), input to a running
# command (`stdin`), file read/write/list/delete/mkdir, directory watching (`watch`, treated
# like a read: the same workspace rule; block it with `blocked_operations`), port and
# credential use, with the caller's authority at that moment.
#
# - A principal acts on sandboxes of its own workspace; a platform `admin` on any.
# - A workspace may forbid operations with data at
#   `data.sandgate.workspaces[<ws>].blocked_operations` (e.g. ["files.write"], or ["pty"] to
#   allow commands but no interactive shell).
# - Commands and terminal sessions can be refused by program name with
#   `data.sandgate.workspaces[<ws>].blocked_programs` (matched against argv[0]'s basename).
# - A workspace may restrict who its commands run as with
#   `data.sandgate.workspaces[<ws>].exec_users` (e.g. ["user"]: never `root`, even where the
#   pool declares it); `null` in `input.exec.user` is the pool's default user, `user`.
# - Ports (operation `ports`, `input.port = {"number", "public"}`): a principal of the
#   workspace may open any port of its sandboxes (and gets a token for it); a request
#   through the ports gateway without a token (`input.port.public`, principal `anonymous`)
#   is allowed only for the ports listed in
#   `data.sandgate.workspaces[<ws>].public_ports` (e.g. [3000, 8080]). A request with a
#   token acts as principal `port-token` of the sandbox's workspace, so
#   `blocked_operations: ["ports"]` closes every port at once, tokens included.
#
# Input reference: policies/README.md ("Layers `sandgate.lifecycle` and `sandgate.action`").
package sandgate.action

import rego.v1

default allow := false

allow if input.principal.workspace == input.workspace

allow if "admin" in input.principal.roles

# A suspended principal loses its authority at once, including what it delegated (for a
# delegated token, `input.principal` is the delegator).
deny contains msg if {
	some suspended in data.sandgate.suspended_principals
	suspended == input.principal.principal
	msg := sprintf("principal %s is suspended", [input.principal.principal])
}

deny contains msg if {
	input.principal.workspace != input.workspace
	not "admin" in input.principal.roles
	not public_port_request
	msg := sprintf("principal %s may not act on sandboxes of workspace %s", [input.principal.principal, input.workspace])
}

deny contains msg if {
	input.operation in object.get(data.sandgate.workspaces, [input.workspace, "blocked_operations"], [])
	msg := sprintf("operation %s is blocked in workspace %s", [input.operation, input.workspace])
}

deny contains msg if {
	input.operation in {"exec", "pty"}
	# The basename: split instead of regex.replace, which compiles its pattern on every
	# evaluation (about 40x the cost of the rest of this layer, benches/policy.rs).
	some given in exec_programs
	parts := split(given, "/")
	program := parts[count(parts) - 1]
	program in object.get(data.sandgate.workspaces, [input.workspace, "blocked_programs"], [])
	msg := sprintf("program %s is blocked in workspace %s", [program, input.workspace])
}

# The program as given: `argv[0]`, or, in a logged record being replayed, the `argv0` the
# decision log keeps in place of the argv (src/decision_log.rs `summarize_argv`), so that
# `sandgate policy eval --replay` of a refused exec refuses it again. (Two rules rather than
# `else`: written with `else`, the engine replayed a refused exec's record as allowed;
# tests/it/replay_layers.rs catches it.)
exec_programs contains p if p := input.exec.argv[0]

exec_programs contains p if p := input.exec.argv0

deny contains msg if {
	input.operation == "exec"
	allowed := object.get(data.sandgate.workspaces, [input.workspace, "exec_users"], null)
	allowed != null
	user := object.get(input.exec, "user", null)
	asked := default_user(user)
	not asked in allowed
	msg := sprintf("commands may not run as %s in workspace %s (allowed: %s)", [asked, input.workspace, concat(", ", allowed)])
}

default_user(null) := "user"

default_user(u) := u if u != null

# A request through the ports gateway that carries no token: no principal vouches for it,
# so only the workspace's public ports are open to it.
public_port_request if {
	input.operation == "ports"
	input.port.public == true
}

public_ports := object.get(data.sandgate.workspaces, [input.workspace, "public_ports"], [])

allow if {
	public_port_request
	input.port.number in public_ports
}

deny contains msg if {
	public_port_request
	not input.port.number in public_ports
	msg := sprintf("port %d of sandbox %s is not public in workspace %s: present its token (GET /v1/sandboxes/%s/ports/%d)", [input.port.number, input.sandbox.id, input.workspace, input.sandbox.id, input.port.number])
}
