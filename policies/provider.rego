# Bundled provider-and-account policy (layer `sandgate.provider`): rules attached to a pool's
# provider and account boundary. Evaluated for every pool the failover walk reaches.
#
# - The pool's account must be in good billing standing (`past_due` and `suspended` refuse,
#   and a refusal ends the create: failover never bypasses billing).
# - Production capacity is reserved for production workloads: a pool labelled
#   `environment = "production"` only takes sandboxes labelled the same.
#
# Input reference: policies/README.md ("Layers `sandgate.creation` and `sandgate.provider`").
package sandgate.provider

import rego.v1

default allow := false

allow if input.account.billing == "good"

deny contains msg if {
	input.account.billing != "good"
	msg := sprintf("account %s is not in good billing standing (%s)", [input.account.name, input.account.billing])
}

deny contains msg if {
	input.pool.labels.environment == "production"
	object.get(input.request.labels, "environment", "") != "production"
	msg := sprintf("pool %s is reserved for production workloads", [input.pool.name])
}
