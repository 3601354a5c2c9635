#!/usr/bin/env bash
# Instructions per keep-alive request through sandgate's egress proxy, counted by callgrind.
#
# Wall-clock figures on a shared 2-core machine move by 10-20% from run to run; instruction
# counts do not (the same binary, inputs and environment give the same total whatever else
# the machine is doing), so this is how a change to the request path is judged before and
# after. It runs a small HTTPS origin (Python, keep-alive, 128-byte body) and one `sandgate
# serve` under callgrind, then drives curl through the proxy twice in the same process: N1 and
# N2 requests on one kept-alive connection each. The per-request figure is the difference
# divided by N2 - N1, so start-up, the CONNECT and both TLS handshakes cancel out. Background
# work that runs on a timer (the store's change-feed poll, the policy directory's reload poll)
# does not: under callgrind the larger run lasts longer, so it also counts more of those. The
# second figure counts only the busiest thread (callgrind counts each thread apart): the proxy
# worker that served the tunnel, which is the one to compare a request-path change by. The
# per-thread totals are left in OUT/threads-N1 and OUT/threads-N2, the per-function split of
# each thread in the larger run in OUT/ (callgrind_annotate on the largest file).
#
# usage: benches/callgrind-egress.sh [SANDGATE_BIN] [OUT_DIR]
#   env: N1 (default 500), N2 (default 2500), HTTP (1.1 or 2; default 1.1)
set -euo pipefail
BIN=$(realpath "${1:-target/release/sandgate}")
OUT=${2:-$(mktemp -d /tmp/sandgate-callgrind.XXXXXX)}
N1=${N1:-500}
N2=${N2:-2500}
HTTP=${HTTP:-1.1}
HOST=origin.bench.test
TOKEN=bench-token-0123456789
ROOT=$(cd "$(dirname "$0")/.." && pwd)
for tool in valgrind callgrind_control openssl curl python3; do
  command -v "$tool" >/dev/null || { echo "error: $tool is required" >&2; exit 2; }
done
[ -x "$BIN" ] || { echo "error: $BIN is not an executable sandgate (build: cargo build --release)" >&2; exit 2; }
mkdir -p "$OUT"
cd "$OUT"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# The origin's CA and leaf, generated per run (no key is committed).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=bench-ca \
  -keyout ca.key -out ca.pem 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$HOST" \
  -keyout origin.key -out origin.csr 2>/dev/null
printf 'subjectAltName=DNS:%s\n' "$HOST" > san.ext
openssl x509 -req -in origin.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
  -extfile san.ext -out origin.pem 2>/dev/null

cat > origin.py <<'PY'
import http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    body = b"x" * 128
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("origin.pem", "origin.key")
ctx.set_alpn_protocols(["http/1.1"])
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(srv.server_address[1], flush=True)
srv.serve_forever()
PY
python3 origin.py > origin.port &
pids+=($!)
for _ in $(seq 50); do [ -s origin.port ] && break; sleep 0.1; done
PORT=$(cat origin.port)

mkdir -p policies
cp "$ROOT"/policies/*.rego policies/
cat > sandgate.toml <<EOF
[proxy]
listen = "127.0.0.1:0"
[api]
listen = "127.0.0.1:0"
[tls]
ca_dir = "$OUT/sandgate-certs"
upstream_ca_files = ["$OUT/ca.pem"]
[dns.hosts]
"$HOST" = "127.0.0.1"
[policy]
dir = "$OUT/policies"
[log]
decisions = "off"
level = "warn"
[egress]
allow_private = ["127.0.0.0/8"]
[[egress.identities]]
id = "bench"
token = "$TOKEN"
workspace = "bench"
allow_domains = ["$HOST"]
EOF

valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$OUT/callgrind.out.%p" \
  "$BIN" serve --config sandgate.toml > sandgate.out 2> sandgate.err &
pids+=($!)
VG=$!
for _ in $(seq 600); do grep -q 'proxy on http://' sandgate.err 2>/dev/null && break; sleep 0.2; done
PROXY=$(grep -o 'proxy on http://[^ ,]*' sandgate.err | head -1 | sed 's#proxy on http://##')
[ -n "$PROXY" ] || { echo "error: sandgate did not start; see $OUT/sandgate.err" >&2; exit 1; }

run() { # $1 = requests; prints the instructions counted while curl ran them
  : > urls.txt
  for _ in $(seq "$1"); do printf 'url = "https://%s:%s/"\noutput = "/dev/null"\n' "$HOST" "$PORT" >> urls.txt; done
  callgrind_control -z "$VG" >/dev/null
  curl -s --http"$HTTP" --proxy "http://bench:$TOKEN@$PROXY" \
    --resolve "$HOST:$PORT:127.0.0.1" --cacert sandgate-certs/ca.pem -K urls.txt
  callgrind_control -d "run-$1" "$VG" >/dev/null
  sleep 1
  # This run's dump: one file per thread (callgrind.out.PID.N-TT, --separate-threads), the
  # newest N. Each thread's total goes to threads-REQUESTS, and their sum is printed.
  local f stem t
  f=$(ls -t "$OUT"/callgrind.out.*.* | head -1)
  stem=${f%-*}
  for t in "$stem"-*; do
    printf '%s %s\n' "${t##*-}" "$(grep -m1 '^totals:' "$t" | awk '{print $2}')"
  done > "$OUT/threads-$1"
  awk '{s += $2} END {print s + 0}' "$OUT/threads-$1"
}
# A warm-up so lazily built state (leaf cache, upstream pool, policy) is not in either count.
run 20 >/dev/null
I1=$(run "$N1")
I2=$(run "$N2")
per=$(( (I2 - I1) / (N2 - N1) ))
# The busiest thread of each run: the proxy worker serving that run's tunnel (each run is a
# new tunnel, which may land on another worker than the last).
busiest() { sort -k2 -n "$OUT/threads-$1" | tail -1; }
read -r T1 B1 < <(busiest "$N1")
read -r T2 B2 < <(busiest "$N2")
busiest=$(( (B2 - B1) / (N2 - N1) ))
echo "sandgate $(basename "$BIN"), HTTP/$HTTP keep-alive: $N1 requests $I1 Ir, $N2 requests $I2 Ir"
echo "per request: $per instructions (difference / $((N2 - N1)))"
echo "per request, the busiest thread only (the proxy worker serving the tunnel; threads $T1 and $T2): $busiest instructions"
echo "profile of that worker in the $N2-request run: callgrind_annotate $(ls -t "$OUT"/callgrind.out.*.*-"$T2" | head -1)"
