package sandgate.egress_test

import rego.v1

import data.sandgate.egress

sandbox := {"id": "sb1", "workspace": "ws", "labels": {}, "allow_domains": ["api.example.com", "*.pkg.dev"]}

dest(host) := {"host": host, "port": 443, "ip": null, "scheme": "https", "match_names": names(host)}

# Mirrors sandgate's match_names: the host, then "*.parent" outwards.
names(host) := array.concat([host], [sprintf("*.%s", [concat(".", array.slice(parts, i, count(parts)))]) |
	parts := split(host, ".")
	some i in numbers.range(1, count(parts) - 1)
])

test_exact_name_allowed if {
	egress.allow with input as {"phase": "connect", "sandbox": sandbox, "destination": dest("api.example.com")}
}

test_wildcard_allows_subdomain if {
	egress.allow with input as {"phase": "connect", "sandbox": sandbox, "destination": dest("a.b.pkg.dev")}
}

test_wildcard_does_not_allow_apex if {
	not egress.allow with input as {"phase": "connect", "sandbox": sandbox, "destination": dest("pkg.dev")}
}

test_other_domain_denied if {
	not egress.allow with input as {"phase": "connect", "sandbox": sandbox, "destination": dest("evil.example.com")}
}

test_workspace_data_allows if {
	egress.allow with input as {"phase": "connect", "sandbox": sandbox, "destination": dest("internal.corp")}
		with data.sandgate.workspaces as {"ws": {"allow_domains": {"internal.corp": true}}}
}

test_other_workspace_data_does_not_allow if {
	not egress.allow with input as {"phase": "connect", "sandbox": sandbox, "destination": dest("internal.corp")}
		with data.sandgate.workspaces as {"other": {"allow_domains": {"internal.corp": true}}}
}
