package sandgate.credential_test

import rego.v1

import data.sandgate.credential

cred := {
	"name": "github", "workspace": "ws-a", "user": null,
	"destinations": [{"host": "api.github.com", "ports": [], "methods": ["GET"], "path_prefix": "/repos/"}],
}

req(host, port, method, path) := {
	"credential": cred,
	"sandbox": {"id": "sb1", "workspace": "ws-a", "labels": {}, "allow_domains": []},
	"destination": {"host": host, "port": port, "ip": null, "scheme": "https", "match_names": [host]},
	"request": {"method": method, "path": path},
}

test_matching_destination_allowed if {
	credential.allow with input as req("api.github.com", 443, "GET", "/repos/x")
}

test_other_host_not_allowed if {
	not credential.allow with input as req("evil.example.com", 443, "GET", "/repos/x")
}

test_wrong_method_not_allowed if {
	not credential.allow with input as req("api.github.com", 443, "POST", "/repos/x")
}

test_wrong_path_not_allowed if {
	not credential.allow with input as req("api.github.com", 443, "GET", "/user")
}

test_wrong_port_not_allowed if {
	not credential.allow with input as req("api.github.com", 8443, "GET", "/repos/x")
}

test_other_workspace_denied if {
	r := object.union(req("api.github.com", 443, "GET", "/repos/x"), {"sandbox": {"id": "sb9", "workspace": "ws-b", "labels": {}, "allow_domains": []}})
	not credential.allow with input as r
	count(credential.deny) == 1 with input as r
}

s3_req(host, addressing) := object.union(req(host, 443, "DELETE", "/keep/v.txt"), {
	"credential": object.union(cred, {"type": "aws_sigv4", "destinations": [{"host": host, "ports": [], "methods": [], "path_prefix": null}]}),
	"request": {"method": "DELETE", "path": "/keep/v.txt", "aws": {
		"service": "s3", "region": "auto", "addressing": addressing,
		"operation": null, "action": null, "bucket": null, "key": null, "resource": null,
	}},
})

test_s3_with_unknown_addressing_denied if {
	r := s3_req("bucket.s3.example.test", null)
	count(credential.deny) == 1 with input as r
}

test_s3_with_known_addressing_not_denied if {
	count(credential.deny) == 0 with input as s3_req("bucket.s3.example.test", "virtual_hosted")
	count(credential.deny) == 0 with input as s3_req("s3.example.test", "path")
}
