# Bundled credential policy: a credential may be applied only to a request that matches one
# of the credential's own destinations (host, port, method, path prefix), and only for a
# sandbox of the credential's workspace. sandgate checks the destination match before asking;
# repeating it here keeps the rule visible and lets platform teams narrow it further.
#
# Input reference: policies/README.md.
package sandgate.credential

import rego.v1

default allow := false

allow if {
	input.credential.workspace == input.sandbox.workspace
	some d in input.credential.destinations
	host_matches(d.host, input.destination.host)
	port_allowed(d, input.destination.port)
	method_allowed(d, input.request.method)
	path_allowed(d, input.request.path)
}

deny contains msg if {
	input.credential.workspace != input.sandbox.workspace
	msg := sprintf("credential %s belongs to workspace %s", [input.credential.name, input.credential.workspace])
}

host_matches(pattern, host) if pattern == host

host_matches(pattern, host) if {
	startswith(pattern, "*.")
	suffix := substring(pattern, 1, -1)
	endswith(host, suffix)
	count(host) > count(suffix)
}

port_allowed(d, port) if {
	count(object.get(d, "ports", [])) == 0
	port == 443
}

port_allowed(d, port) if port in object.get(d, "ports", [])

method_allowed(d, _) if count(object.get(d, "methods", [])) == 0

method_allowed(d, method) if upper(method) in {upper(m) | some m in d.methods}

path_allowed(d, _) if object.get(d, "path_prefix", null) == null

path_allowed(d, path) if {
	is_string(d.path_prefix)
	startswith(path, d.path_prefix)
}

# An S3 request whose host does not say whether the bucket is in the host or in the path (neither
# one of AWS's S3 names nor the credential's `endpoint`) reaches the policy with no addressing,
# bucket, key, operation or action. Bucket and key rules cannot hold for it (a deny on bucket
# "logs" would not see `logs.s3.example.test/k`), so it is refused rather than guessed; setting
# `endpoint` on the credential (`apply.endpoint = "s3.example.test"`) removes the ambiguity.
deny contains msg if {
	input.credential.type == "aws_sigv4"
	input.request.aws.service == "s3"
	input.request.aws.addressing == null
	msg := sprintf("credential %s: cannot tell which S3 bucket a request to %s addresses (path-style or virtual-hosted); set apply.endpoint on the credential", [input.credential.name, input.destination.host])
}
