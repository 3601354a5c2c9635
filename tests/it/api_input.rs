//! Strict API input: a corpus of malformed requests over real HTTP (reqwest, and raw TCP for
//! bytes reqwest will not send as they are), against an in-process gateway with a simulated
//! pool so that well-formed creates succeed.
//!
//! Every malformed request must be refused with a 4xx in the one error shape
//! (`{"error": {"code", "message", "details"}}` plus `X-Sandgate-Error`), without echoing
//! what was sent, and must change nothing: the sandbox, credential and delegation lists, and
//! the store's row counts, are the same after the whole corpus as before it. Positive controls
//! (a valid create, a valid credential) show the same requests do work when well formed.

use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An admin of workspace `ws-a`: no request below is refused for lack of authority, so each
/// reaches the validation it is meant to hit.
const ADMIN: &str = "api-token-admin-a-0123456789";
/// Never appears in any answer.
const MARKER: &str = "LEAKME-7f3a";

fn config() -> String {
    format!(
        r#"
[[api.tokens]]
token = "{ADMIN}"
principal = "alice"
workspace = "ws-a"
roles = ["admin"]

[create]
short_wait_ms = 3000

[[providers]]
name = "sim"
kind = "simulated"
capabilities = {{ isolation = ["microvm"], egress = "gateway" }}

[[accounts]]
name = "acct-a"
provider = "sim"

[[pools]]
name = "pool-a"
provider = "sim"
account = "acct-a"
"#
    )
}

/// One malformed request and the refusal it must get.
struct Case {
    name: String,
    method: &'static str,
    /// Raw request target bytes (sent as they are when `raw`).
    target: Vec<u8>,
    body: Option<Vec<u8>>,
    headers: Vec<(&'static str, String)>,
    /// The bearer token sent (`None`: no `Authorization` header).
    token: Option<&'static str>,
    raw: bool,
    /// Refused by the HTTP parser before the API sees it (hyper answers a bare 400): only
    /// the status and "nothing changed" are checked, and the case does not count towards
    /// the corpus of error-shape answers.
    bare: bool,
    status: u16,
    code: &'static str,
    field: Option<String>,
}

fn case(name: impl Into<String>, method: &'static str, target: impl Into<Vec<u8>>) -> Case {
    Case {
        name: name.into(),
        method,
        target: target.into(),
        body: None,
        headers: Vec::new(),
        token: Some(ADMIN),
        raw: false,
        bare: false,
        status: 400,
        code: "invalid_request",
        field: None,
    }
}

impl Case {
    fn body(mut self, body: impl Into<Vec<u8>>) -> Case {
        self.body = Some(body.into());
        self
    }
    fn json(self, body: Value) -> Case {
        self.body(serde_json::to_vec(&body).unwrap())
    }
    fn header(mut self, name: &'static str, value: impl Into<String>) -> Case {
        self.headers.push((name, value.into()));
        self
    }
    fn token(mut self, token: Option<&'static str>) -> Case {
        self.token = token;
        self
    }
    fn raw(mut self) -> Case {
        self.raw = true;
        self
    }
    fn bare(mut self) -> Case {
        self.bare = true;
        self
    }
    fn expect(mut self, status: u16, code: &'static str) -> Case {
        self.status = status;
        self.code = code;
        self
    }
    fn field(mut self, field: impl Into<String>) -> Case {
        self.field = Some(field.into());
        self
    }
}

struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

async fn send(gw: &Gateway, http: &reqwest::Client, c: &Case) -> Answer {
    if c.raw {
        return send_raw(gw, c).await;
    }
    let target = String::from_utf8(c.target.clone()).expect("a reqwest case has a UTF-8 target");
    let method = reqwest::Method::from_bytes(c.method.as_bytes()).unwrap();
    let mut req = http
        .request(method, gw.api(&target))
        .timeout(Duration::from_secs(30));
    if let Some(token) = c.token {
        req = req.bearer_auth(token);
    }
    if let Some(body) = &c.body {
        req = req
            .header("content-type", "application/json")
            .body(body.clone());
    }
    for (k, v) in &c.headers {
        req = req.header(*k, v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = resp.bytes().await.unwrap().to_vec();
    Answer {
        status,
        headers,
        body,
    }
}

/// Writes the request byte for byte (`Connection: close`) and reads the whole answer.
async fn send_raw(gw: &Gateway, c: &Case) -> Answer {
    let mut stream = tokio::net::TcpStream::connect(gw.server.api_addr())
        .await
        .unwrap();
    let mut req = Vec::new();
    req.extend_from_slice(c.method.as_bytes());
    req.push(b' ');
    req.extend_from_slice(&c.target);
    req.extend_from_slice(b" HTTP/1.1\r\nHost: sandgate.test\r\nConnection: close\r\n");
    if let Some(token) = c.token {
        req.extend_from_slice(format!("Authorization: Bearer {token}\r\n").as_bytes());
    }
    for (k, v) in &c.headers {
        req.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    if let Some(body) = &c.body {
        req.extend_from_slice(
            format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            )
            .as_bytes(),
        );
    }
    req.extend_from_slice(b"\r\n");
    if let Some(body) = &c.body {
        req.extend_from_slice(body);
    }
    stream.write_all(&req).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut out))
        .await
        .expect("the gateway answers and closes")
        .unwrap();
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(out.len());
    let head = String::from_utf8_lossy(&out[..split]).into_owned();
    let body = out.get(split + 4..).unwrap_or_default().to_vec();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Answer {
        status,
        headers,
        body,
    }
}

/// What a malformed request must not change.
#[derive(Debug, PartialEq)]
struct Snapshot {
    sandboxes: Value,
    credentials: Value,
    delegations: Value,
    rows: Vec<(&'static str, i64)>,
}

async fn get_json(http: &reqwest::Client, url: String) -> Value {
    let resp = http.get(url).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

async fn snapshot(gw: &Gateway, http: &reqwest::Client, sandbox: &str) -> Snapshot {
    let db = gw.dir.path().join("data/sandgate.db");
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&db)
        .read_only(true);
    let mut conn = <sqlx::SqliteConnection as sqlx::Connection>::connect_with(&options)
        .await
        .unwrap();
    let mut rows = Vec::new();
    for (table, sql) in [
        ("sandboxes", "SELECT COUNT(*) FROM sandboxes"),
        ("credentials", "SELECT COUNT(*) FROM credentials"),
        ("delegations", "SELECT COUNT(*) FROM delegations"),
        ("idempotency_keys", "SELECT COUNT(*) FROM idempotency_keys"),
        ("snapshots", "SELECT COUNT(*) FROM snapshots"),
    ] {
        let n: i64 = sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap();
        rows.push((table, n));
    }
    Snapshot {
        sandboxes: get_json(http, gw.api("/v1/sandboxes?limit=500")).await,
        credentials: get_json(http, gw.api("/v1/workspaces/ws-a/credentials")).await,
        delegations: get_json(
            http,
            gw.api(&format!("/v1/sandboxes/{sandbox}/delegations")),
        )
        .await,
        rows,
    }
}

fn credential(name: &str) -> Value {
    json!({
        "name": name,
        "secret": format!("{MARKER}-secret"),
        "destinations": [{"host": "api.a.test", "methods": ["GET"], "path_prefix": "/v1/"}],
        "apply": {"type": "header", "name": "authorization", "template": "Bearer {secret}"},
        "placeholder_env": "A_TOKEN"
    })
}

/// The malformed requests; `sb` is a running sandbox of `ws-a`.
fn corpus(sb: &str) -> Vec<Case> {
    let create = "/v1/sandboxes";
    let creds = "/v1/workspaces/ws-a/credentials";
    let exec = format!("/v1/sandboxes/{sb}/exec");
    let mint = format!("/v1/sandboxes/{sb}/delegations");
    let files = format!("/v1/sandboxes/{sb}/files");
    let mut cases = vec![
        // ---- JSON syntax, for the create body
        case("trailing garbage", "POST", create).body(r#"{"labels":{}} xyz"#),
        case("a second JSON value", "POST", create).body(r#"{"labels":{}}{"labels":{}}"#),
        case("trailing comma", "POST", create).body(r#"{"labels":{},}"#),
        case("empty body", "POST", create).body(""),
        case("not JSON", "POST", create).body(format!("hello {MARKER}")),
        case("a JSON array", "POST", create).body("[]"),
        case("JSON null", "POST", create).body("null"),
        case("a JSON string", "POST", create).body(format!("\"{MARKER}\"")),
        case("invalid UTF-8 in a string", "POST", create)
            .body(b"{\"labels\":{\"a\":\"\xff\xfe\"}}".to_vec()),
        case("a lone surrogate escape", "POST", create).body(r#"{"labels":{"a":"\ud800"}}"#),
        case("nested 200 deep", "POST", create).body(format!(
            "{}{}",
            "[".repeat(200),
            "]".repeat(200)
        )),
        case("duplicate top-level key", "POST", create)
            .body(r#"{"labels":{"a":"1"},"labels":{"a":"2"}}"#),
        case("duplicate label key", "POST", create)
            .body(r#"{"labels":{"a":"1","a":"2"}}"#)
            .field("labels.a"),
        // Just over the limit, so that the gateway has read (nearly) all of it when it
        // answers and the client is not cut off mid-write.
        case("body over 1 MiB", "POST", create)
            .json(json!({"labels": {"big": "x".repeat(1024 * 1024)}}))
            .expect(413, "payload_too_large"),
        // ---- closed schemas
        case("unknown top-level field", "POST", create)
            .json(json!({"gpu_please": true}))
            .field("gpu_please"),
        case("unknown resources field", "POST", create)
            .json(json!({"resources": {"cpus": 2}}))
            .field("resources.cpus"),
        case("unknown routing field", "POST", create)
            .json(json!({"routing": {"pool_selectors": {}}}))
            .field("routing.pool_selectors"),
        case("source with two kinds", "POST", create)
            .json(json!({"source": {"image": "a", "template": "b"}})),
        // ---- numeric bounds
        case("negative cpu", "POST", create)
            .json(json!({"resources": {"cpu": -2}}))
            .field("resources.cpu"),
        case("zero cpu", "POST", create)
            .json(json!({"resources": {"cpu": 0}}))
            .field("resources.cpu"),
        case("absurd cpu", "POST", create)
            .json(json!({"resources": {"cpu": 1e300}}))
            .field("resources.cpu"),
        case("infinite cpu", "POST", create).body(r#"{"resources":{"cpu":1e999}}"#),
        case("NaN cpu", "POST", create).body(r#"{"resources":{"cpu":NaN}}"#),
        case("cpu as a string", "POST", create)
            .json(json!({"resources": {"cpu": "2"}}))
            .field("resources.cpu"),
        case("negative memory", "POST", create)
            .json(json!({"resources": {"memory_mb": -1}}))
            .field("resources.memory_mb"),
        case("zero memory", "POST", create)
            .json(json!({"resources": {"memory_mb": 0}}))
            .field("resources.memory_mb"),
        case("memory beyond u64", "POST", create)
            .body(r#"{"resources":{"memory_mb":18446744073709551616}}"#),
        case("fractional memory", "POST", create)
            .json(json!({"resources": {"memory_mb": 1.5}}))
            .field("resources.memory_mb"),
        case("zero disk", "POST", create)
            .json(json!({"resources": {"disk_gb": 0}}))
            .field("resources.disk_gb"),
        case("absurd disk", "POST", create)
            .json(json!({"resources": {"disk_gb": 1_000_000_000_000u64}}))
            .field("resources.disk_gb"),
        case("negative gpu", "POST", create)
            .json(json!({"resources": {"gpu": -1}}))
            .field("resources.gpu"),
        case("absurd gpu", "POST", create)
            .json(json!({"resources": {"gpu": 100_000}}))
            .field("resources.gpu"),
        case("zero max_skew", "POST", create)
            .json(json!({"routing": {"spread": [{"topology": "zone", "max_skew": 0}]}}))
            .field("routing.spread[0].max_skew"),
        case("zero affinity weight", "POST", create)
            .json(
                json!({"routing": {"pool_affinity": {"preferred": [{"weight": 0, "key": "gen"}]}}}),
            )
            .field("routing.pool_affinity.preferred[0].weight"),
        // ---- names and labels
        case("NUL in a label key", "POST", create)
            .json(json!({"labels": {format!("a\u{0}{MARKER}"): "x"}}))
            .field("labels"),
        case("empty label key", "POST", create)
            .json(json!({"labels": {"": "x"}}))
            .field("labels"),
        case("newline in a label value", "POST", create)
            .json(json!({"labels": {"team": format!("a\n{MARKER}")}}))
            .field("labels.team"),
        case("bidi override in a label value", "POST", create)
            .json(json!({"labels": {"team": "\u{202E}nimda"}}))
            .field("labels.team"),
        case("label key of 300 bytes", "POST", create)
            .json(json!({"labels": {"k".repeat(300): "x"}}))
            .field("labels"),
        case("ESC in a region", "POST", create)
            .json(json!({"regions": ["us-east-1", "eu\u{1b}[31m"]}))
            .field("regions[1]"),
        case("NUL in a pool selector key", "POST", create)
            .json(json!({"routing": {"pool_selector": {"tier\u{0}": "1"}}}))
            .field("routing.pool_selector"),
        case("control in an affinity key", "POST", create)
            .json(json!({"routing": {"pool_affinity": {"required": [{"key": "g\u{7}"}]}}}))
            .field("routing.pool_affinity.required[0].key"),
        case("NUL in the workspace", "POST", create)
            .json(json!({"workspace": "ws-a\u{0}"}))
            .field("workspace"),
        case("empty image", "POST", create)
            .json(json!({"source": {"image": ""}}))
            .field("source.image"),
        case("not a CIDR", "POST", create)
            .json(json!({"network": {"allow_domains": ["api.a.test"], "cidrs": ["10.0.0.0/99"]}}))
            .field("network.cidrs[0]"),
        case("NUL in a credential reference", "POST", create)
            .json(json!({"credentials": ["gh\u{0}"]}))
            .field("credentials[0]"),
        case("Idempotency-Key over 255 bytes", "POST", create)
            .json(json!({"labels": {"team": "b"}}))
            .header("idempotency-key", "k".repeat(300)),
        // ---- routes:explain shares the create body's rules
        case("explain: trailing garbage", "POST", "/v1/routes:explain").body(r#"{} ]"#),
        case("explain: negative cpu", "POST", "/v1/routes:explain")
            .json(json!({"resources": {"cpu": -1}}))
            .field("resources.cpu"),
        // ---- credentials
        case("credential named ..", "POST", creds)
            .json(credential(".."))
            .field("name"),
        case("credential named .", "POST", creds)
            .json(credential("."))
            .field("name"),
        case("credential name with a slash", "POST", creds)
            .json(credential("a/b"))
            .field("name"),
        case("credential name with NUL", "POST", creds)
            .json(credential("gh\u{0}x"))
            .field("name"),
        case("credential: trailing garbage", "POST", creds).body(format!(
            "{} {MARKER}",
            serde_json::to_string(&credential("fresh")).unwrap()
        )),
        case("credential: unknown field", "POST", creds).json({
            let mut c = credential("fresh");
            c["secrets"] = json!("x");
            c
        }),
        case("credential: unknown destination field", "POST", creds).json({
            let mut c = credential("fresh");
            c["destinations"][0]["hostname"] = json!("x");
            c
        }),
        case("credential: port 0", "POST", creds)
            .json({
                let mut c = credential("fresh");
                c["destinations"][0]["ports"] = json!([0]);
                c
            })
            .field("destinations[0].ports[0]"),
        case("credential: port beyond u16", "POST", creds).json({
            let mut c = credential("fresh");
            c["destinations"][0]["ports"] = json!([70000]);
            c
        }),
        case("credential: CRLF in the header template", "POST", creds)
            .json({
                let mut c = credential("fresh");
                c["apply"]["template"] = json!("Bearer {secret}\r\nx-injected: 1");
                c
            })
            .field("apply.template"),
        case("credential: a method that is not a token", "POST", creds)
            .json({
                let mut c = credential("fresh");
                c["destinations"][0]["methods"] = json!(["GE T"]);
                c
            })
            .field("destinations[0].methods[0]"),
        case("credential: NUL in the path prefix", "POST", creds)
            .json({
                let mut c = credential("fresh");
                c["destinations"][0]["path_prefix"] = json!("/v1/\u{0}");
                c
            })
            .field("destinations[0].path_prefix"),
        case("credential: control in the user", "POST", creds)
            .json({
                let mut c = credential("fresh");
                c["user"] = json!("bob\u{8}");
                c
            })
            .field("user"),
        case("credential: a secret of the wrong type", "POST", creds).json({
            let mut c = credential("fresh");
            c["secret"] = json!({"nested": MARKER});
            c
        }),
        case(
            "credential: NUL in the workspace path",
            "POST",
            "/v1/workspaces/ws%00a/credentials",
        )
        .json(credential("fresh")),
        case(
            "credential: invalid UTF-8 in the workspace path",
            "POST",
            "/v1/workspaces/%FF%FE/credentials",
        )
        .json(credential("fresh")),
        case(
            "credential replace: trailing garbage",
            "PUT",
            format!("{creds}/gh"),
        )
        .body(format!(
            "{} x",
            serde_json::to_string(&credential("gh")).unwrap()
        )),
        case("credential replace: name ..", "PUT", format!("{creds}/.."))
            .json(credential(".."))
            .raw()
            .expect(404, "not_found"),
        case(
            "credential read: invalid UTF-8 name",
            "GET",
            format!("{creds}/%C0%AF"),
        ),
        // ---- path and query extraction
        case("sandbox id: invalid UTF-8", "GET", "/v1/sandboxes/%FF").field("id"),
        case(
            "sandbox id: overlong UTF-8",
            "DELETE",
            "/v1/sandboxes/%C0%80",
        )
        .field("id"),
        case("sandbox id: NUL", "DELETE", "/v1/sandboxes/sb-%00").field("id"),
        case(
            "sandbox id: invalid percent escape",
            "GET",
            "/v1/sandboxes/sb-%ZZ",
        )
        .expect(404, "not_found"),
        // http::Uri refuses these bytes, so hyper answers before any service runs.
        case(
            "raw 0xFF in the path",
            "GET",
            b"/v1/sandboxes/sb-\xff".to_vec(),
        )
        .raw()
        .bare(),
        case(
            "raw NUL in the path",
            "GET",
            b"/v1/sandboxes/sb-\x00".to_vec(),
        )
        .raw()
        .bare(),
        case(
            "delegation id: invalid UTF-8",
            "DELETE",
            "/v1/delegations/%FF",
        ),
        case("snapshot id: control", "DELETE", "/v1/snapshots/snap-%07"),
        case(
            "exec id: invalid UTF-8",
            "POST",
            format!("{exec}/%FF/cancel"),
        ),
        case("list: negative limit", "GET", "/v1/sandboxes?limit=-1"),
        case("list: zero limit", "GET", "/v1/sandboxes?limit=0").field("limit"),
        case("list: limit over 500", "GET", "/v1/sandboxes?limit=501").field("limit"),
        case("list: limit not a number", "GET", "/v1/sandboxes?limit=ten"),
        case(
            "list: repeated limit",
            "GET",
            "/v1/sandboxes?limit=1&limit=2",
        ),
        case("list: unknown parameter", "GET", "/v1/sandboxes?bogus=1"),
        case("list: unknown state", "GET", "/v1/sandboxes?state=sleeping").field("state"),
        case("list: label without =", "GET", "/v1/sandboxes?label=team").field("label"),
        case(
            "list: NUL in a label",
            "GET",
            "/v1/sandboxes?label=te%00am=a",
        )
        .field("label"),
        case(
            "list: invalid UTF-8 in the query",
            "GET",
            "/v1/sandboxes?state=%FF",
        ),
        case("files: no path", "GET", format!("{files}/content")),
        case(
            "files: NUL in the path",
            "GET",
            format!("{files}?path=/tmp/a%00b"),
        )
        .field("path"),
        case(
            "files: repeated path",
            "DELETE",
            format!("{files}?path=a&path=b"),
        ),
        case(
            "files: recursive not a bool",
            "DELETE",
            format!("{files}?path=a&recursive=yes"),
        ),
        case(
            "files: upload over 64 MiB",
            "PUT",
            format!("{files}/content?path=/tmp/big"),
        )
        .body(vec![b'x'; 64 * 1024 * 1024 + 1])
        .expect(413, "payload_too_large"),
        // ---- methods and unknown endpoints
        case("PATCH on the sandbox collection", "PATCH", create).expect(405, "method_not_allowed"),
        case("PUT on the sandbox collection", "PUT", create)
            .json(json!({}))
            .expect(405, "method_not_allowed"),
        case("DELETE on the sandbox collection", "DELETE", create)
            .expect(405, "method_not_allowed"),
        case("POST on a sandbox", "POST", format!("/v1/sandboxes/{sb}"))
            .json(json!({}))
            .expect(405, "method_not_allowed"),
        case("GET on exec", "GET", exec.clone()).expect(405, "method_not_allowed"),
        case("an extension method", "BREW", "/v1/sandboxes")
            .raw()
            .expect(405, "method_not_allowed"),
        case("OPTIONS", "OPTIONS", "/v1/policies").expect(405, "method_not_allowed"),
        case("unknown endpoint", "GET", "/v1/nope").expect(404, "not_found"),
        case(
            "unknown sub-resource",
            "POST",
            format!("/v1/sandboxes/{sb}/reboot"),
        )
        .expect(404, "not_found"),
        // ---- exec
        case("exec: trailing garbage", "POST", exec.clone()).body(r#"{"argv":["true"]} {}"#),
        case("exec: unknown field", "POST", exec.clone())
            .json(json!({"argv": ["true"], "shell": true}))
            .field("shell"),
        case("exec: empty argv", "POST", exec.clone())
            .json(json!({"argv": []}))
            .field("argv"),
        case("exec: NUL in argv", "POST", exec.clone())
            .json(json!({"argv": ["echo", "a\u{0}b"]}))
            .field("argv[1]"),
        case("exec: zero timeout", "POST", exec.clone())
            .json(json!({"argv": ["true"], "timeout_ms": 0}))
            .field("timeout_ms"),
        case("exec: negative timeout", "POST", exec.clone())
            .json(json!({"argv": ["true"], "timeout_ms": -5}))
            .field("timeout_ms"),
        case("exec: env name with =", "POST", exec.clone())
            .json(json!({"argv": ["true"], "env": {"A=B": "1"}}))
            .field("env"),
        case("exec: NUL in an env value", "POST", exec.clone())
            .json(json!({"argv": ["true"], "env": {"A": format!("x\u{0}{MARKER}")}}))
            .field("env.A"),
        case("exec: NUL in cwd", "POST", exec.clone())
            .json(json!({"argv": ["true"], "cwd": "/tmp\u{0}"}))
            .field("cwd"),
        // ---- delegations
        case("mint: trailing garbage", "POST", mint.clone())
            .body(r#"{"agent":"ci","actions":["exec"]}garbage"#),
        case("mint: unknown field", "POST", mint.clone())
            .json(json!({"agent": "ci", "actions": ["exec"], "scope": "all"}))
            .field("scope"),
        case("mint: NUL in the agent", "POST", mint.clone())
            .json(json!({"agent": "ci\u{0}bot", "actions": ["exec"]}))
            .field("agent"),
        case("mint: zero ttl", "POST", mint.clone())
            .json(json!({"agent": "ci", "actions": ["exec"], "ttl_secs": 0}))
            .field("ttl_secs"),
        case("mint: negative ttl", "POST", mint.clone())
            .json(json!({"agent": "ci", "actions": ["exec"], "ttl_secs": -1}))
            .field("ttl_secs"),
        case("mint: no actions", "POST", mint.clone())
            .json(json!({"agent": "ci", "actions": []}))
            .field("actions"),
        case("mint: not delegable", "POST", mint.clone())
            .json(json!({"agent": "ci", "actions": ["delete"]}))
            .field("actions[0]"),
    ];
    // Unauthenticated requests are refused in the same shape.
    cases.push(
        case("no token", "POST", create)
            .json(json!({}))
            .token(None)
            .expect(401, "unauthenticated"),
    );
    cases.push(
        case("a wrong token", "POST", creds)
            .json(credential("fresh"))
            .token(Some("wrong-token-0000"))
            .expect(401, "unauthenticated"),
    );
    cases
}

fn check(c: &Case, a: &Answer) -> Result<(), String> {
    let full = String::from_utf8_lossy(&a.body);
    let text: String = full.chars().take(300).collect();
    if a.status != c.status {
        return Err(format!("status {} (want {}): {text}", a.status, c.status));
    }
    if c.bare {
        return Ok(());
    }
    if !a
        .header("content-type")
        .is_some_and(|t| t.starts_with("application/json"))
    {
        return Err(format!(
            "content-type {:?}, not JSON: {text}",
            a.header("content-type")
        ));
    }
    let body: Value =
        serde_json::from_slice(&a.body).map_err(|e| format!("not JSON ({e}): {text}"))?;
    let code = body["error"]["code"].as_str().unwrap_or_default();
    if code != c.code {
        return Err(format!("code {code:?} (want {:?}): {text}", c.code));
    }
    if body["error"]["message"].as_str().is_none_or(str::is_empty) {
        return Err(format!("no error.message: {text}"));
    }
    if a.header("x-sandgate-error") != Some(code) {
        return Err(format!(
            "x-sandgate-error {:?} (want {code:?})",
            a.header("x-sandgate-error")
        ));
    }
    if let Some(field) = &c.field {
        if body["error"]["details"]["field"] != *field {
            return Err(format!("details.field is not {field:?}: {text}"));
        }
    }
    if full.contains(MARKER) {
        return Err(format!("the answer echoes what was sent: {text}"));
    }
    if c.status == 405 && a.header("allow").is_none() {
        return Err("a 405 without an Allow header".into());
    }
    Ok(())
}

#[tokio::test]
async fn malformed_requests_are_refused_in_the_error_shape_and_change_nothing() {
    let gw = Gateway::start(GatewayOptions {
        extra_toml: config(),
        ..GatewayOptions::default()
    })
    .await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();

    // Positive controls: well-formed requests to the same endpoints work.
    let resp = http
        .post(gw.api("/v1/workspaces/ws-a/credentials"))
        .bearer_auth(ADMIN)
        .json(&credential("gh"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap());
    let resp = http
        .post(gw.api("/v1/sandboxes"))
        .bearer_auth(ADMIN)
        .json(&json!({
            "labels": {"team": "a", "app.kubernetes.io/name": "web"},
            "credentials": ["gh"],
            "resources": {"gpu": 0},
            "regions": []
        }))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let created: Value = resp.json().await.unwrap();
    assert_eq!(status, 201, "{created}");
    let sb = created["id"].as_str().unwrap().to_string();
    let resp = http
        .post(gw.api(&format!("/v1/sandboxes/{sb}/delegations")))
        .bearer_auth(ADMIN)
        .json(&json!({"agent": "ci-bot", "actions": ["files.read"], "ttl_secs": 60}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap());

    let before = snapshot(&gw, &http, &sb).await;
    assert_eq!(before.sandboxes["sandboxes"].as_array().unwrap().len(), 1);
    assert_eq!(
        before.credentials["credentials"].as_array().unwrap().len(),
        1
    );

    let cases = corpus(&sb);
    let shaped = cases.iter().filter(|c| !c.bare).count();
    assert!(shaped >= 50, "the corpus has {shaped} error-shape cases");
    let mut failures = Vec::new();
    for c in &cases {
        let answer = send(&gw, &http, c).await;
        if let Err(why) = check(c, &answer) {
            failures.push(format!("{}: {why}", c.name));
        }
    }
    let after = snapshot(&gw, &http, &sb).await;
    assert!(
        failures.is_empty(),
        "{} of {} malformed requests were not refused as they should be:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    assert_eq!(before, after, "a malformed request changed something");

    // The same endpoints still take well-formed requests after the corpus.
    let resp = http
        .post(gw.api("/v1/workspaces/ws-a/credentials"))
        .bearer_auth(ADMIN)
        .json(&credential("gh-2"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap());
}

/// The file upload endpoint keeps its own, larger limit: a body over the JSON limit (1 MiB)
/// is accepted there, and refused on a JSON endpoint.
#[tokio::test]
async fn body_limits_are_per_endpoint() {
    let gw = Gateway::start(GatewayOptions {
        extra_toml: config(),
        ..GatewayOptions::default()
    })
    .await;
    let http = reqwest::Client::new();
    let two_mib = vec![b' '; 2 * 1024 * 1024];
    // The upload endpoint reads the body (2 MiB, over the JSON limit) and only then finds
    // no such sandbox.
    let resp = http
        .put(gw.api("/v1/sandboxes/sb-none/files/content?path=/tmp/x"))
        .bearer_auth(ADMIN)
        .body(two_mib.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let mut json_body = b"{}".to_vec();
    json_body.extend_from_slice(&two_mib[..1024 * 1024]);
    let resp = http
        .post(gw.api("/v1/routes:explain"))
        .bearer_auth(ADMIN)
        .header("content-type", "application/json")
        .body(json_body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(resp.headers()["x-sandgate-error"], "payload_too_large");
    // The rest of the body was not read: the connection is not reused.
    assert_eq!(resp.headers()["connection"], "close");
}

/// Every answer carries `X-Request-Id`: the caller's when it is a plain token, a fresh one
/// when it sent none or something else (never echoed as sent), on successes, refusals and
/// unknown endpoints alike.
#[tokio::test]
async fn every_answer_carries_a_request_id() {
    let gw = Gateway::start(GatewayOptions {
        extra_toml: config(),
        ..GatewayOptions::default()
    })
    .await;
    let http = reqwest::Client::new();
    let id_of = |resp: &reqwest::Response| {
        resp.headers()
            .get("x-request-id")
            .map(|v| v.to_str().unwrap().to_string())
    };
    let resp = http
        .get(gw.api("/v1/pools"))
        .bearer_auth(ADMIN)
        .header("x-request-id", "trace-42.a_b:c")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(id_of(&resp).as_deref(), Some("trace-42.a_b:c"));
    let mut seen = std::collections::HashSet::new();
    for (path, token, offered, status) in [
        ("/v1/pools", Some(ADMIN), None, 200),
        ("/v1/pools", None, None, 401),
        (
            "/v1/no-such-thing",
            Some(ADMIN),
            Some(format!("{MARKER} x")),
            404,
        ),
        (
            "/v1/sandboxes/sb-none",
            Some(ADMIN),
            Some("a".repeat(129)),
            404,
        ),
    ] {
        let mut req = http.get(gw.api(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(o) = &offered {
            req = req.header("x-request-id", o);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), status, "{path}");
        let id = id_of(&resp).unwrap_or_else(|| panic!("{path}: no X-Request-Id"));
        assert!(id.starts_with("req-") && id.len() == 40, "{path}: {id}");
        assert!(!id.contains(MARKER));
        assert!(seen.insert(id), "{path}: an id was reused");
    }
}
