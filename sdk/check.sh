#!/usr/bin/env bash
# Builds and unit-tests sandgate's own SDKs: sdk/python with pytest in its own venv (its
# pinned sdk/python/requirements-test.txt, reinstalled only when that file changes) and
# sdk/typescript with tsc (locked by package-lock.json) and node --test. Then packages them
# (`python -m build`, `npm pack`), installs each artifact into a clean venv / node project
# in a temporary directory and imports it there. Fails, never skips: without python3 venv
# support, node, npm or the pinned packages there is nothing to check. The scenario suites
# against a real gateway (tests/it/sdk_python.rs, sdk_typescript.rs) use this venv and the
# TypeScript compiler installed here, so .ci/run runs this before `cargo test`.
set -euo pipefail
cd "$(dirname "$0")"
VENV="${SANDGATE_PYSDK_VENV:-/opt/sandgate-pysdk-venv}"
REQUIREMENTS=python/requirements-test.txt
STAMP="$VENV/.sandgate-requirements"
if ! "$VENV/bin/python" -c '' >/dev/null 2>&1 || ! cmp -s "$REQUIREMENTS" "$STAMP"; then
  python3 -m venv --clear "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQUIREMENTS"
  cp "$REQUIREMENTS" "$STAMP"
fi
(cd python && "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests)
# Types: the package under --strict, and the examples as a user's code, against the models
# generated from the OpenAPI document (a field or enum value the API does not have fails).
"$VENV/bin/python" -m mypy --strict --cache-dir=/dev/null python/sandgate
MYPYPATH=python "$VENV/bin/python" -m mypy --cache-dir=/dev/null ../examples/sdk/python
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "error: node and npm are needed to build and test sdk/typescript" >&2
  exit 1
fi
npm ci --prefix typescript --no-audit --no-fund --loglevel=error
npm test --prefix typescript --silent

# Packages, installed where nothing else is and imported there.
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$VENV/bin/python" -m build --no-isolation --sdist --wheel --outdir "$WORK/dist" python >/dev/null
# The oldest Python the package supports when the machine has one that runs (pyenv's shim
# may exist without a runnable 3.9 behind it), else python3.
CLEAN_PYTHON=python3
for candidate in python3.9 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.9*/bin/python3.9; do
  if "$candidate" -c '' >/dev/null 2>&1; then
    CLEAN_PYTHON=$candidate
    break
  fi
done
"$CLEAN_PYTHON" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --disable-pip-version-check "$WORK"/dist/sandgate-*.whl
(cd "$WORK" && "$WORK/venv/bin/python" - <<'PY'
import pathlib, sandgate, sandgate.schema
from sandgate import AsyncClient, Client, PolicyDenied
root = pathlib.Path(sandgate.__file__).parent
assert "/venv/" in str(root), root  # the installed package, not the work tree
assert (root / "py.typed").is_file(), "py.typed is not in the wheel"
assert "CreateBody" in sandgate.schema.__all__
import sys
print("sdk: the wheel installs and imports in a clean venv: sandgate", sandgate.__version__, "on Python", sys.version.split()[0])
PY
)
tar -tzf "$WORK"/dist/sandgate-*.tar.gz > "$WORK/sdist.txt"
grep -q "sandgate/py.typed" "$WORK/sdist.txt"
(cd typescript && npm pack --silent --pack-destination "$WORK" >/dev/null)
mkdir "$WORK/consumer"
cat > "$WORK/consumer/package.json" <<'JSON'
{"name": "consumer", "version": "0.0.0", "private": true, "type": "module"}
JSON
npm install --prefix "$WORK/consumer" --no-audit --no-fund --loglevel=error "$WORK"/sandgate-sdk-*.tgz
cat > "$WORK/consumer/use.ts" <<'TS'
import { Client, PolicyDenied, type CreateBody } from "@sandgate/sdk";
const body: CreateBody = { provider: "local", network: { allow_domains: ["api.github.com"] } };
const client = new Client({ baseUrl: "http://127.0.0.1:1", token: "t" });
export const pending: Promise<unknown> = client.sandboxes.create(body, { dryRun: true });
export const cls: typeof PolicyDenied = PolicyDenied;
TS
# The package's types, as a consumer's compiler resolves them (Node's ESM rules).
node typescript/node_modules/typescript/bin/tsc --noEmit --strict --module nodenext \
  --moduleResolution nodenext --target es2022 --lib es2022,dom "$WORK/consumer/use.ts"
(cd "$WORK/consumer" && node --input-type=module -e '
import { Client, PolicyDenied, errorFromResponse } from "@sandgate/sdk";
const e = errorFromResponse(403, { error: { code: "policy_denied", message: "m", details: {} } }, new Headers());
if (!(e instanceof PolicyDenied) || typeof Client !== "function") throw new Error("bad package");
console.log("sdk: the npm package installs and imports in a clean project");
')
echo "sdk: python and typescript unit tests passed; both packages build, install and import"
