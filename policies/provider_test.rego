package sandgate.provider_test

import rego.v1

import data.sandgate.provider

admit(billing, pool_labels, request_labels) := {
	"principal": {"principal": "alice", "workspace": "ws-a", "roles": []},
	"workspace": "ws-a",
	"sandbox": {"id": "sb-1", "workspace": "ws-a", "labels": request_labels},
	"request": {"labels": request_labels},
	"pool": {"name": "p1", "provider": "sim", "labels": pool_labels},
	"account": {"name": "acct", "provider": "sim", "billing": billing, "labels": {}, "credential_bound": true},
	"attempt": {"number": 1, "previous": []},
}

test_good_standing_allowed if {
	provider.allow with input as admit("good", {}, {})
	count(provider.deny) == 0 with input as admit("good", {}, {})
}

test_suspended_account_denied if {
	not provider.allow with input as admit("suspended", {}, {})
	count(provider.deny) == 1 with input as admit("suspended", {}, {})
}

test_past_due_account_denied if {
	not provider.allow with input as admit("past_due", {}, {})
}

test_production_pool_reserved if {
	count(provider.deny) == 1 with input as admit("good", {"environment": "production"}, {})
	count(provider.deny) == 0 with input as admit("good", {"environment": "production"}, {"environment": "production"})
}
