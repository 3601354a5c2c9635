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

# Narrow entries, one destination each (what `sandgate policy suggest` prints):
# data.sandgate.workspaces[ws].allow_requests, an array or an object of entries
# {"host", "port", "methods", "path_prefix"}. The host and port must be equal; at the
# connect phase (no request seen yet) that is enough to open the tunnel, which is then
# inspected, so every request in it is checked: its method must be listed (none listed:
# any) and its path (without query) must be path_prefix or below it, by whole segments
# ("/v1/a" covers "/v1/a" and "/v1/a/b", not "/v1/ab"; a prefix ending in "/" covers
# everything below it). A destination whose action is "tunnel" skips that check: do not
# give one an entry narrower than its host.
allow if {
	some entry in data.sandgate.workspaces[input.sandbox.workspace].allow_requests
	entry.host == input.destination.host
	entry.port == input.destination.port
	request_allowed(entry)
}

request_allowed(_) if input.phase == "connect"

request_allowed(entry) if {
	input.phase == "request"
	method_listed(object.get(entry, "methods", []), input.request.method)
	path_under(split(input.request.path, "?")[0], object.get(entry, "path_prefix", "/"))
}

method_listed(methods, _) if count(methods) == 0

method_listed(methods, method) if upper(method) in {upper(m) | some m in methods}

path_under(path, prefix) if path == prefix

path_under(path, prefix) if {
	endswith(prefix, "/")
	startswith(path, prefix)
}

path_under(path, prefix) if startswith(path, concat("", [prefix, "/"]))

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
