# Bundled egress policy: a sandbox may reach exactly the domains it was given
# (`allow_domains`: exact names and "*.suffix" wildcards), plus any domain its workspace
# allows in data (data.sandgate.workspaces[ws].allow_domains, an object keyed by pattern so
# a large list is a lookup, not a scan). Everything else is denied.
#
# Input reference: policies/README.md.
package sandgate.egress

import rego.v1

default allow := false

# The destination host and the "*.parent" patterns that cover it, computed by sandgate:
# a lookup per name instead of a match per pattern.
names := {n | some n in input.destination.match_names}

sandbox_patterns := {p | some p in input.sandbox.allow_domains}

allow if {
	some name in names
	name in sandbox_patterns
}

allow if {
	some name in names
	data.sandgate.workspaces[input.sandbox.workspace].allow_domains[name]
}

default action := "inspect"
