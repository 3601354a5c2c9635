# Bundled egress policy: a sandbox may reach exactly the domains it was given
# (`allow_domains`: exact names and "*.suffix" wildcards), plus any domain its workspace
# allows in data (data.sandgate.workspaces[ws].allow_domains, an object keyed by pattern so
# a large list is a lookup, not a scan), plus any destination whose addresses all lie in
# the networks it was given (`cidrs`). Everything else is denied.
#
# Input reference: policies/README.md.
package sandgate.egress

import rego.v1

default allow := false

# input.destination.match_names is the host and the "*.parent" patterns that cover it,
# computed by sandgate: a lookup per name instead of a match per pattern.
allow if {
	some name in input.destination.match_names
	name in input.sandbox.allow_domains
}

allow if {
	some name in input.destination.match_names
	data.sandgate.workspaces[input.sandbox.workspace].allow_domains[name]
}

# By address: input.destination.ips is every address the connection may be dialed on (an
# IP literal's own, or what sandgate resolved and vetted for a name; empty before that), so
# all of them must lie inside the sandbox's cidrs, or a later address could leave them.
allow if {
	count(input.destination.ips) > 0
	every ip in input.destination.ips {
		some cidr in input.sandbox.cidrs
		net.cidr_contains(cidr, ip)
	}
}

default action := "inspect"
