# Example (copy into your policy directory): a GitHub App credential may fetch and clone and
# call the API read-only, but never push: git's push is the `git-receive-pack` service, and
# API writes are every method but GET and HEAD.
package sandgate.credential

import rego.v1

deny contains "pushing with a GitHub App credential is not allowed" if {
	input.credential.type == "github_app"
	git_push(input.request)
}

deny contains msg if {
	input.credential.type == "github_app"
	not git_fetch(input.request)
	not input.request.method in {"GET", "HEAD"}
	msg := sprintf("%s %s is a write; this GitHub App credential is read-only", [input.request.method, path_of(input.request)])
}

path_of(request) := split(request.path, "?")[0]

git_push(request) if endswith(path_of(request), "/git-receive-pack")

git_push(request) if {
	endswith(path_of(request), "/info/refs")
	contains(request.path, "service=git-receive-pack")
}

# Fetching is a POST to git-upload-pack: a read, though its method is not.
git_fetch(request) if endswith(path_of(request), "/git-upload-pack")
