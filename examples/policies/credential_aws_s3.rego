# Example (copy into your policy directory): the `s3-reports` AWS credential may read one
# bucket and write under one prefix of it, and nothing else: no DeleteObject, no other
# bucket. sandgate gives the credential layer the operation each request targets
# (`input.request.aws`), derived from the request the sandbox's SDK sent.
package sandgate.credential

import rego.v1

reports_bucket := "acme-reports"

deny contains msg if {
	input.credential.type == "aws_sigv4"
	input.credential.name == "s3-reports"
	not s3_allowed
	msg := sprintf("%s on %s is not allowed with credential %s", [
		object.get(input.request.aws, "action", "an unrecognised S3 operation"),
		object.get(input.request.aws, "bucket", "no bucket"),
		input.credential.name,
	])
}

s3_allowed if {
	input.request.aws.bucket == reports_bucket
	input.request.aws.action in {"s3:GetObject", "s3:ListBucket"}
}

s3_allowed if {
	input.request.aws.bucket == reports_bucket
	input.request.aws.action == "s3:PutObject"
	startswith(input.request.aws.key, "out/")
}
