package sandgate.credential_github_app_test

import rego.v1

import data.sandgate.credential

gh(method, path) := {
	"credential": {"name": "gh", "workspace": "ws-a", "type": "github_app", "destinations": []},
	"sandbox": {"id": "sb1", "workspace": "ws-a", "labels": {}, "allow_domains": []},
	"destination": {"host": "github.com", "port": 443, "ip": null, "scheme": "https"},
	"request": {"method": method, "path": path},
}

test_clone_is_not_denied if {
	count(credential.deny) == 0 with input as gh("GET", "/acme/app.git/info/refs?service=git-upload-pack")
	count(credential.deny) == 0 with input as gh("POST", "/acme/app.git/git-upload-pack")
}

test_push_is_denied if {
	"pushing with a GitHub App credential is not allowed" in credential.deny with input as gh("GET", "/acme/app.git/info/refs?service=git-receive-pack")
	"pushing with a GitHub App credential is not allowed" in credential.deny with input as gh("POST", "/acme/app.git/git-receive-pack")
}

test_api_reads_are_not_denied if {
	count(credential.deny) == 0 with input as gh("GET", "/repos/acme/app/pulls")
}

test_api_writes_are_denied if {
	count(credential.deny) == 1 with input as gh("POST", "/repos/acme/app/issues")
}

test_other_types_are_not_affected if {
	base := gh("POST", "/acme/app.git/git-receive-pack")
	r := object.union(base, {"credential": object.union(base.credential, {"type": "header"})})
	count(credential.deny) == 0 with input as r
}
