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

cidr_sandbox := object.union(sandbox, {"cidrs": ["10.1.0.0/16", "192.0.2.7/32"]})

at(host, ips) := object.union(dest(host), {"ip": ips[0], "ips": ips})

test_ip_literal_inside_cidr_allowed if {
	egress.allow with input as {"phase": "connect", "sandbox": cidr_sandbox, "destination": at("10.1.2.3", ["10.1.2.3"])}
}

test_resolved_name_inside_cidr_allowed if {
	egress.allow with input as {"phase": "connect", "sandbox": cidr_sandbox, "destination": at("db.internal", ["192.0.2.7", "10.1.9.9"])}
}

test_address_outside_cidr_denied if {
	not egress.allow with input as {"phase": "connect", "sandbox": cidr_sandbox, "destination": at("10.2.0.1", ["10.2.0.1"])}
}

test_one_address_outside_cidr_denies_the_name if {
	not egress.allow with input as {"phase": "connect", "sandbox": cidr_sandbox, "destination": at("db.internal", ["10.1.0.1", "10.2.0.1"])}
}

test_unresolved_name_not_allowed_by_cidrs if {
	not egress.allow with input as {"phase": "connect", "sandbox": cidr_sandbox, "destination": object.union(dest("db.internal"), {"ips": []})}
}

test_no_cidrs_no_address_allow if {
	not egress.allow with input as {"phase": "connect", "sandbox": sandbox, "destination": at("10.1.2.3", ["10.1.2.3"])}
}
