package sandgate.credential_aws_s3_test

import rego.v1

import data.sandgate.credential

s3_request(action, bucket, key) := {
	"credential": {"name": "s3-reports", "workspace": "ws-a", "type": "aws_sigv4", "destinations": []},
	"sandbox": {"id": "sb1", "workspace": "ws-a", "labels": {}, "allow_domains": []},
	"destination": {"host": "s3.us-east-1.amazonaws.com", "port": 443, "ip": null, "scheme": "https"},
	"request": {"method": "GET", "path": "/", "aws": {
		"service": "s3", "region": "us-east-1", "action": action, "addressing": "path",
		"operation": substring(action, 3, -1), "bucket": bucket, "key": key,
	}},
}

test_get_in_the_bucket_is_not_denied if {
	count(credential.deny) == 0 with input as s3_request("s3:GetObject", "acme-reports", "q3.csv")
}

test_put_under_out_is_not_denied if {
	count(credential.deny) == 0 with input as s3_request("s3:PutObject", "acme-reports", "out/q3.csv")
}

test_put_elsewhere_is_denied if {
	count(credential.deny) == 1 with input as s3_request("s3:PutObject", "acme-reports", "in/q3.csv")
}

test_delete_is_denied if {
	some msg in credential.deny with input as s3_request("s3:DeleteObject", "acme-reports", "q3.csv")
	contains(msg, "s3:DeleteObject")
}

test_other_bucket_is_denied if {
	count(credential.deny) == 1 with input as s3_request("s3:GetObject", "someone-else", "x")
}

test_unrecognised_operation_is_denied if {
	base := s3_request("s3:GetObject", "acme-reports", "x")
	unknown := {"service": "s3", "region": "us-east-1", "action": null, "operation": null, "bucket": "acme-reports", "key": null}
	r := object.union(base, {"request": object.union(base.request, {"aws": unknown})})
	count(credential.deny) == 1 with input as r
}

test_other_credentials_are_not_affected if {
	base := s3_request("s3:DeleteObject", "acme-reports", "x")
	r := object.union(base, {"credential": object.union(base.credential, {"name": "s3-admin"})})
	count(credential.deny) == 0 with input as r
}
