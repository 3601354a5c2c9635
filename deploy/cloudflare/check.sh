#!/usr/bin/env bash
# Typechecks the bridge Worker against the pinned @cloudflare/sandbox types (and the fake's
# samples against the bridge's own contract, src/api.ts). Fails, never skips: without node,
# npm or the locked packages there is nothing to check, which is an error.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "error: node and npm are needed to typecheck deploy/cloudflare" >&2
  exit 1
fi
# Exactly the locked versions, every time (a few seconds): the check is of those, not of
# whatever an earlier install left.
npm ci --no-audit --no-fund --loglevel=error
npm run --silent check
echo "deploy/cloudflare: typechecked against @cloudflare/sandbox $(node -p 'require("./node_modules/@cloudflare/sandbox/package.json").version')"
