# Bundled lifecycle policy (layer `sandgate.lifecycle`): may this principal start, stop,
# pause, resume, snapshot, read the metrics of (E2B's get_metrics) or delete this sandbox?
#
# - A principal manages sandboxes of its own workspace; a platform `admin` any.
# - A sandbox labelled `protected: "true"` can only be deleted by an admin.
#
# Input reference: policies/README.md ("Layers `sandgate.lifecycle` and `sandgate.action`").
package sandgate.lifecycle

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
	msg := sprintf("principal %s may not manage sandboxes of workspace %s", [input.principal.principal, input.workspace])
}

deny contains msg if {
	input.operation == "delete"
	input.sandbox.labels.protected == "true"
	not "admin" in input.principal.roles
	msg := sprintf("sandbox %s is protected; only an admin may delete it", [input.sandbox.id])
}
