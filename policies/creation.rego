# Bundled creation policy (layer `sandgate.creation`): may this principal create a sandbox in
# this workspace on this pool? Evaluated for every pool the failover walk reaches, with the
# caller's authority at that moment; approval for one pool never carries over to the next.
#
# - A principal creates in its own workspace; a platform `admin` in any.
# - A workspace may restrict itself to approved pools with data at
#   `data.sandgate.workspaces[<ws>].approved_pools` (an array of pool names).
#
# Input reference: policies/README.md ("Layers `sandgate.creation` and `sandgate.provider`").
package sandgate.creation

import rego.v1

default allow := false

allow if input.principal.workspace == input.workspace

allow if "admin" in input.principal.roles

deny contains msg if {
	input.principal.workspace != input.workspace
	not "admin" in input.principal.roles
	msg := sprintf("principal %s may not create sandboxes in workspace %s", [input.principal.principal, input.workspace])
}

deny contains msg if {
	restricts_pools
	not pool_approved
	msg := sprintf("pool %s is not approved for workspace %s", [input.pool.name, input.workspace])
}

restricts_pools if is_array(data.sandgate.workspaces[input.workspace].approved_pools)

pool_approved if input.pool.name in data.sandgate.workspaces[input.workspace].approved_pools
