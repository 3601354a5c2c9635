//! Credentials whose applied value sandgate mints: OAuth2 access tokens (client credentials
//! and refresh token grants) and GitHub App installation tokens. Real sockets throughout:
//! the token endpoint is an HTTPS fake the gateway reaches through its own resolver, the
//! origin records what reaches it, the sandbox is a reqwest client (or `git`) through the
//! proxy trusting only sandgate's CA. Everything the gateway logs through `tracing` is
//! captured, and each test ends by checking that no log line, decision record, metric or API
//! answer holds a secret or a token.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use axum::extract::State;
use axum::response::IntoResponse;
use base64::Engine as _;
use sandgate::base::ids::random_hex;

const CLIENT_ID: &str = "client-7c1d";
const CLIENT_SECRET: &str = "cs3cr3t-0a9f8e7d6c5b";
const FIRST_REFRESH_TOKEN: &str = "rt-initial-5e4d3c2b1a";

/// The OAuth2 token endpoint fake: issues tokens that live `ttl_secs`, counts calls, can
/// answer 503 a number of times or refuse the grant, and rotates refresh tokens.
#[derive(Default)]
struct TokenEndpoint {
    calls: AtomicUsize,
    ttl_secs: AtomicU64,
    fail_next: AtomicUsize,
    refuse: AtomicBool,
    /// The refresh token the next refresh must present (rotated on each use).
    refresh_token: Mutex<String>,
    issued: Mutex<Vec<String>>,
    refresh_tokens_issued: Mutex<Vec<String>>,
    /// `(grant_type, client authenticated)` of each call.
    grants: Mutex<Vec<(String, bool)>>,
}

impl TokenEndpoint {
    fn new(ttl_secs: u64) -> Arc<TokenEndpoint> {
        let endpoint = TokenEndpoint::default();
        endpoint.ttl_secs.store(ttl_secs, Ordering::SeqCst);
        *endpoint.refresh_token.lock().unwrap() = FIRST_REFRESH_TOKEN.into();
        Arc::new(endpoint)
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn last_issued(&self) -> String {
        self.issued
            .lock()
            .unwrap()
            .last()
            .cloned()
            .unwrap_or_default()
    }
}

async fn token(
    State(endpoint): State<Arc<TokenEndpoint>>,
    headers: http::HeaderMap,
    body: bytes::Bytes,
) -> axum::response::Response {
    let n = endpoint.calls.fetch_add(1, Ordering::SeqCst) + 1;
    let form: std::collections::HashMap<String, String> =
        url::form_urlencoded::parse(&body).into_owned().collect();
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{CLIENT_ID}:{CLIENT_SECRET}"))
    );
    let authenticated = headers
        .get(http::header::AUTHORIZATION)
        .is_some_and(|v| v.as_bytes() == expected.as_bytes());
    let grant = form.get("grant_type").cloned().unwrap_or_default();
    endpoint
        .grants
        .lock()
        .unwrap()
        .push((grant.clone(), authenticated));
    let oauth_error = |status: u16, error: &str| {
        let body = serde_json::json!({"error": error, "error_description": format!("call {n}")});
        (
            http::StatusCode::from_u16(status).unwrap(),
            axum::Json(body),
        )
            .into_response()
    };
    if endpoint
        .fail_next
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| f.checked_sub(1))
        .is_ok()
    {
        return oauth_error(503, "temporarily_unavailable");
    }
    if !authenticated {
        return oauth_error(401, "invalid_client");
    }
    if endpoint.refuse.load(Ordering::SeqCst) {
        return oauth_error(400, "invalid_grant");
    }
    let mut answer = serde_json::json!({
        "token_type": "Bearer",
        "expires_in": endpoint.ttl_secs.load(Ordering::SeqCst),
    });
    match grant.as_str() {
        "client_credentials" => {}
        "refresh_token" => {
            let mut current = endpoint.refresh_token.lock().unwrap();
            if form.get("refresh_token") != Some(&*current) {
                return oauth_error(400, "invalid_grant");
            }
            let rotated = format!("rt-rotated-{n}-{}", random_hex(4));
            *current = rotated.clone();
            endpoint
                .refresh_tokens_issued
                .lock()
                .unwrap()
                .push(rotated.clone());
            answer["refresh_token"] = rotated.into();
        }
        _ => return oauth_error(400, "unsupported_grant_type"),
    }
    let access = format!("at-{n}-{}", random_hex(4));
    endpoint.issued.lock().unwrap().push(access.clone());
    answer["access_token"] = access.into();
    axum::Json(answer).into_response()
}

struct Setup {
    name: &'static str,
    /// What another replica of `gw` is started with.
    replica: (String, Option<String>),
    gw: Gateway,
    origin: Origin,
    endpoint: Arc<TokenEndpoint>,
    ca: TestCa,
    secrets: tempfile::TempDir,
}

/// A gateway with one OAuth2 credential `name` (of `grant`) bound to sandbox `sb-a` for
/// `api.oauth.test`, whose tokens come from the fake at `auth.oauth.test`.
async fn setup(name: &'static str, grant: &str, secret: &str, ttl_secs: u64) -> Setup {
    setup_on(name, grant, secret, ttl_secs, None, |_| {}).await
}

/// [`setup`], on the Postgres database `store_url` when given.
async fn setup_on(
    name: &'static str,
    grant: &str,
    secret: &str,
    ttl_secs: u64,
    store_url: Option<String>,
    adjust: fn(&mut GatewayOptions),
) -> Setup {
    capture_logs();
    init();
    let ca = TestCa::new();
    let origin = start_origin(Some(ca.server_config(&["api.oauth.test"]))).await;
    let endpoint = TokenEndpoint::new(ttl_secs);
    let router = axum::Router::new()
        .route("/oauth/token", axum::routing::post(token))
        .with_state(endpoint.clone());
    let auth = serve_router(router, ca.server_config(&["auth.oauth.test"])).await;
    let secrets = tempfile::tempdir().unwrap();
    let secret_file = secrets.path().join("api");
    std::fs::write(&secret_file, secret).unwrap();
    let extra_toml = format!(
        r#"{ADMIN_TOML}
[[credentials]]
workspace = "ws-a"
name = "{name}"
secret_file = {secret_file:?}
placeholder_env = "API_TOKEN"
destinations = [{{ host = "api.oauth.test", ports = [{port}] }}]
apply = {{ type = "oauth2", grant = "{grant}", token_url = "https://auth.oauth.test:{auth_port}/oauth/token", client_id = "{CLIENT_ID}", scopes = ["read", "write"] }}
"#,
        secret_file = secret_file.display().to_string(),
        port = origin.port(),
        auth_port = auth.port(),
    );
    let mut options = replica_options(
        name,
        &ca,
        extra_toml.clone(),
        store_url.clone(),
        secrets.path().join("master.key"),
    );
    adjust(&mut options);
    let gw = Gateway::start(options).await;
    Setup {
        name,
        replica: (extra_toml, store_url),
        gw,
        origin,
        endpoint,
        ca,
        secrets,
    }
}

fn replica_options(
    name: &'static str,
    ca: &TestCa,
    extra_toml: String,
    store_url: Option<String>,
    master_key_file: std::path::PathBuf,
) -> GatewayOptions {
    GatewayOptions {
        identities: vec![IdentitySpec {
            id: "sb-a",
            workspace: "ws-a",
            allow_domains: vec!["api.oauth.test"],
            credentials: vec![name],
        }],
        hosts: vec![
            ("api.oauth.test", "127.0.0.1"),
            ("auth.oauth.test", "127.0.0.1"),
        ],
        upstream_ca: Some(ca.pem_path.clone()),
        extra_toml,
        store_url,
        master_key_file: Some(master_key_file),
        ..Default::default()
    }
}

impl Setup {
    /// A second gateway on the same store and master key (Postgres only: a SQLite store is
    /// one gateway's).
    async fn another_replica(&self) -> Gateway {
        self.start_again(None).await
    }

    /// A gateway with this one's configuration, master key and store: the Postgres database,
    /// or the SQLite file `sqlite` (a restart on the state an earlier gateway left).
    async fn start_again(&self, sqlite: Option<std::path::PathBuf>) -> Gateway {
        let (extra_toml, store_url) = self.replica.clone();
        let key = self.secrets.path().join("master.key");
        let mut options = replica_options(self.name, &self.ca, extra_toml, store_url, key);
        options.store_path = sqlite;
        Gateway::start(options).await
    }

    fn url(&self) -> String {
        format!("https://api.oauth.test:{}/v1/things", self.origin.port())
    }

    async fn get(&self, client: &reqwest::Client) -> (u16, serde_json::Value) {
        let response = client.get(self.url()).send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or_default())
    }

    /// The bearer token the origin saw on the last request.
    fn last_bearer(&self) -> String {
        let seen = self.origin.last().unwrap();
        seen.headers["authorization"]
            .strip_prefix("Bearer ")
            .unwrap()
            .to_string()
    }

    async fn credential_view(&self) -> serde_json::Value {
        let path = format!("/v1/workspaces/ws-a/credentials/{}", self.name);
        self.gw.api_json(&path, ADMIN).await
    }

    async fn metrics(&self) -> String {
        self.gw.api_get("/metrics", ADMIN).await
    }

    /// No secret, access token or refresh token in any log line, decision record, metric
    /// or API answer.
    async fn assert_no_secret_leaked(&self, extra: &[String]) {
        let mut secrets: Vec<String> = vec![CLIENT_SECRET.into(), FIRST_REFRESH_TOKEN.into()];
        secrets.extend(self.endpoint.issued.lock().unwrap().iter().cloned());
        secrets.extend(
            self.endpoint
                .refresh_tokens_issued
                .lock()
                .unwrap()
                .iter()
                .cloned(),
        );
        secrets.extend(extra.iter().cloned());
        let logs = String::from_utf8_lossy(&captured_logs().lock().unwrap()).into_owned();
        let decisions = std::fs::read_to_string(&self.gw.decision_log).unwrap_or_default();
        let view = self.credential_view().await.to_string();
        let list = self
            .gw
            .api_get("/v1/workspaces/ws-a/credentials", ADMIN)
            .await;
        let metrics = self.metrics().await;
        for secret in secrets.iter().filter(|s| !s.is_empty()) {
            for (what, text) in [
                ("a log line", &logs),
                ("the decision log", &decisions),
                ("the credential's API view", &view),
                ("the credential list", &list),
                ("the metrics", &metrics),
            ] {
                assert!(!text.contains(secret.as_str()), "{what} holds a secret");
            }
        }
        assert!(
            !logs.is_empty(),
            "nothing was captured: the check would prove nothing"
        );
    }
}

/// The API token of workspace `ws-a`'s admin (see [`ADMIN_TOML`]).
const ADMIN: &str = "api-token-ws-a-0123456789";
const ADMIN_TOML: &str = r#"
[[api.tokens]]
token = "api-token-ws-a-0123456789"
principal = "alice"
workspace = "ws-a"
"#;

/// The token endpoint fake is evidence only if a standard OAuth2 client accepts it: Authlib
/// gets a client_credentials token, refreshes (receiving a rotated refresh token) and sees
/// the spent refresh token refused with invalid_grant.
#[tokio::test]
async fn the_token_endpoint_fake_is_what_an_oauth2_client_library_expects() {
    init();
    let python = sdk::python();
    if let Some(why) = sdk::missing(&python, "authlib") {
        assert!(!in_ci(), "{why}");
        eprintln!("skipping outside CI: {why}");
        return;
    }
    let ca = TestCa::new();
    let endpoint = TokenEndpoint::new(60);
    let router = axum::Router::new()
        .route("/oauth/token", axum::routing::post(token))
        .with_state(endpoint.clone());
    let auth = serve_router(router, ca.server_config(&["localhost"])).await;
    let url = format!("https://localhost:{}/oauth/token", auth.port());
    let ca_file = ca.pem_path.display().to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(fixture("oauth2_client.py"))
            .args([
                &url,
                &ca_file,
                CLIENT_ID,
                CLIENT_SECRET,
                FIRST_REFRESH_TOKEN,
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.lines().count(), 3, "{stdout}");
    assert_eq!(endpoint.calls(), 3);
    let grants = endpoint.grants.lock().unwrap().clone();
    assert_eq!(grants[0], ("client_credentials".to_string(), true));
    assert_eq!(grants[1], ("refresh_token".to_string(), true));
}

#[tokio::test]
async fn client_credentials_token_is_cached_refreshed_early_and_once_for_fifty() {
    let s = setup("cached", "client_credentials", CLIENT_SECRET, 8).await;
    let ok_before = refresh_count(&s.metrics().await, "ok");
    let client = s.gw.client("sb-a", false);

    let (status, _) = s.get(&client).await;
    assert_eq!(status, 200);
    assert_eq!(s.endpoint.calls(), 1);
    let first = s.endpoint.last_issued();
    assert_eq!(s.last_bearer(), first, "the origin gets the minted token");
    assert_eq!(
        s.endpoint.grants.lock().unwrap()[0],
        ("client_credentials".to_string(), true)
    );
    let (status, _) = s.get(&client).await;
    assert_eq!(status, 200);
    assert_eq!(s.endpoint.calls(), 1, "a fresh token is reused");

    // In the last quarter of its life the token is still used, and refreshed behind it.
    tokio::time::sleep(Duration::from_millis(6300)).await;
    let (status, _) = s.get(&client).await;
    assert_eq!(status, 200);
    assert_eq!(
        s.last_bearer(),
        first,
        "still the old token: it has not expired"
    );
    for _ in 0..100 {
        if s.endpoint.calls() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(s.endpoint.calls(), 2, "one background refresh");
    let second = s.endpoint.last_issued();
    let (status, _) = s.get(&client).await;
    assert_eq!(status, 200);
    assert_eq!(s.last_bearer(), second);

    // Past expiry, fifty concurrent requests cause one refresh between them.
    tokio::time::sleep(Duration::from_millis(8200)).await;
    let before = s.origin.count();
    let requests = (0..50).map(|_| {
        let client = client.clone();
        let url = s.url();
        async move { client.get(url).send().await.unwrap().status().as_u16() }
    });
    let statuses = futures_util::future::join_all(requests).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(
        s.endpoint.calls(),
        3,
        "fifty requests at expiry, one refresh"
    );
    let third = s.endpoint.last_issued();
    let seen = s.origin.seen.lock().unwrap()[before..].to_vec();
    assert_eq!(seen.len(), 50);
    assert!(seen
        .iter()
        .all(|r| r.headers["authorization"] == format!("Bearer {third}")));

    let view = s.credential_view().await;
    assert_eq!(view["type"], "oauth2");
    assert_eq!(view["token"]["last_refresh_outcome"], "ok");
    assert_eq!(view["token"]["refreshes"], 3);
    assert!(view["token"]["expires_at"].as_str().unwrap().ends_with('Z'));
    // Metrics are the process's: other tests of this binary refresh too.
    let metrics = s.metrics().await;
    assert!(refresh_count(&metrics, "ok") >= ok_before + 3, "{metrics}");
    assert!(
        metrics.contains(
            r#"sandgate_credential_applied_total{workspace="ws-a",credential="cached"} 54"#
        ),
        "{metrics}"
    );
    let records = s.gw.decisions(54).await;
    let applied = records
        .iter()
        .find(|r| r["credentials"][0] == "cached")
        .unwrap();
    assert_eq!(applied["credential_types"][0], "oauth2");
    s.assert_no_secret_leaked(&[]).await;
}

#[tokio::test]
async fn a_rotated_refresh_token_is_used_next_and_kept_sealed() {
    let secret = serde_json::json!({
        "client_secret": CLIENT_SECRET, "refresh_token": FIRST_REFRESH_TOKEN,
    })
    .to_string();
    let s = setup("rotating", "refresh_token", &secret, 1).await;
    let client = s.gw.client("sb-a", false);
    for round in 1..=3 {
        let (status, body) = s.get(&client).await;
        assert_eq!(status, 200, "round {round}: {body}");
        assert_eq!(s.last_bearer(), s.endpoint.last_issued());
        assert_eq!(s.endpoint.calls(), round);
        // Each refresh presented the token the previous one rotated to (the fake refuses
        // any other with invalid_grant).
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let grants = s.endpoint.grants.lock().unwrap().clone();
    assert!(grants
        .iter()
        .all(|g| g == &("refresh_token".to_string(), true)));

    // The newest refresh token is in the store, sealed: the row exists, the token is not
    // in the database file in the clear.
    let newest = s
        .endpoint
        .refresh_tokens_issued
        .lock()
        .unwrap()
        .last()
        .cloned()
        .unwrap();
    let db = s.gw.dir.path().join("data/sandgate.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    let rows: Vec<(String, Vec<u8>)> =
        sqlx::query_as("SELECT name, sealed FROM store_secrets WHERE name LIKE 'oauth2%'")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].0, "oauth2-refresh-token/ws-a/rotating");
    assert!(!String::from_utf8_lossy(&rows[0].1).contains(&newest));
    pool.close().await;
    let file = std::fs::read(&db).unwrap();
    assert!(!String::from_utf8_lossy(&file).contains(&newest));
    s.assert_no_secret_leaked(&[]).await;
}

/// Two replicas share one rotating refresh token: each reads the newest one from the store
/// before it refreshes, so neither presents a token the other already spent.
#[tokio::test]
async fn replicas_take_turns_with_a_rotating_refresh_token_on_postgres() {
    const TEST: &str = "replicas_take_turns_with_a_rotating_refresh_token_on_postgres";
    let Some(server) = postgres::server_or_skip(TEST) else {
        return;
    };
    let db = postgres::TestDatabase::create(&server, "rotating_replicas").await;
    let secret = serde_json::json!({
        "client_secret": CLIENT_SECRET, "refresh_token": FIRST_REFRESH_TOKEN,
    })
    .to_string();
    let s = setup_on(
        "shared",
        "refresh_token",
        &secret,
        1,
        Some(db.url.expose().to_string()),
        |_| {},
    )
    .await;
    let other = s.another_replica().await;
    let clients = [s.gw.client("sb-a", false), other.client("sb-a", false)];
    for round in 0..4 {
        let (status, body) = s.get(&clients[round % 2]).await;
        assert_eq!(
            status,
            200,
            "round {round} on replica {}: {body}",
            round % 2
        );
        assert_eq!(s.endpoint.calls(), round + 1);
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    assert_eq!(s.endpoint.refresh_tokens_issued.lock().unwrap().len(), 4);
    drop(other);
    s.assert_no_secret_leaked(&[]).await;
    drop(s);
    db.drop().await;
}

/// Stops `gw` (its listeners close, its tasks end) and keeps its directory, which may hold
/// the SQLite store the next gateway opens.
fn stop(gw: Gateway, kept: &mut Vec<tempfile::TempDir>) {
    let Gateway { server, dir, .. } = gw;
    server.shutdown();
    kept.push(dir);
}

/// The credential's refresh token is in the config file and the token endpoint rotates it on
/// every refresh, refusing a spent one with invalid_grant. A gateway restarted (same store,
/// same file) between rotations must refresh with the newest token, not the file's spent one:
/// the file's credential is written again only when its declaration changed.
#[tokio::test]
async fn a_restart_between_rotations_keeps_the_newest_refresh_token() {
    let secret = serde_json::json!({
        "client_secret": CLIENT_SECRET, "refresh_token": FIRST_REFRESH_TOKEN,
    })
    .to_string();
    let mut s = setup("restarting", "refresh_token", &secret, 1).await;
    let db = s.gw.dir.path().join("data/sandgate.db");
    let mut kept = Vec::new();
    for round in 1..=3 {
        let client = s.gw.client("sb-a", false);
        let (status, body) = s.get(&client).await;
        assert_eq!(
            status,
            200,
            "round {round} (after {} restarts): {body}",
            round - 1
        );
        assert_eq!(s.last_bearer(), s.endpoint.last_issued());
        assert_eq!(s.endpoint.calls(), round, "each round refreshes once");
        let view = s.credential_view().await;
        assert_eq!(
            view["version"], 1,
            "a restart rewrote the credential: {view}"
        );
        // The token lives 1 s: the next round, on a restarted gateway, must refresh.
        let fresh = s.start_again(Some(db.clone())).await;
        stop(std::mem::replace(&mut s.gw, fresh), &mut kept);
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    assert_eq!(s.endpoint.refresh_tokens_issued.lock().unwrap().len(), 3);

    // A change around the secret (here the scopes) writes a new version at start; the file's
    // secret is the one written before, so the token rotated from it moves to the new version.
    s.replica.0 = s
        .replica
        .0
        .replace(r#"scopes = ["read", "write"]"#, r#"scopes = ["read"]"#);
    let fresh = s.start_again(Some(db.clone())).await;
    stop(std::mem::replace(&mut s.gw, fresh), &mut kept);
    let view = s.credential_view().await;
    assert_eq!(view["version"], 2, "the changed file replaced it: {view}");
    assert_eq!(
        view["apply"]["scopes"],
        serde_json::json!(["read"]),
        "{view}"
    );
    let (status, body) = s.get(&s.gw.client("sb-a", false)).await;
    assert_eq!(status, 200, "after a change of scopes: {body}");
    assert_eq!(s.endpoint.calls(), 4);
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // A new secret in the file replaces the credential, which starts from that token.
    let replaced = serde_json::json!({
        "client_secret": CLIENT_SECRET, "refresh_token": s.endpoint.refresh_token.lock().unwrap().clone(),
    })
    .to_string();
    std::fs::write(s.secrets.path().join("api"), replaced).unwrap();
    let fresh = s.start_again(Some(db.clone())).await;
    stop(std::mem::replace(&mut s.gw, fresh), &mut kept);
    let view = s.credential_view().await;
    assert_eq!(view["version"], 3, "the changed file replaced it: {view}");
    let (status, body) = s.get(&s.gw.client("sb-a", false)).await;
    assert_eq!(status, 200, "after a new secret: {body}");
    s.assert_no_secret_leaked(&[]).await;
}

/// A rolling deploy on Postgres: two replicas share the rotating refresh token and restart
/// in turn, each after it rotated the token; neither start writes the config's (spent)
/// token over the rotated one.
#[tokio::test]
async fn replicas_restarting_in_turn_keep_the_newest_refresh_token_on_postgres() {
    const TEST: &str = "replicas_restarting_in_turn_keep_the_newest_refresh_token_on_postgres";
    let Some(server) = postgres::server_or_skip(TEST) else {
        return;
    };
    let db = postgres::TestDatabase::create(&server, "restarting_replicas").await;
    let secret = serde_json::json!({
        "client_secret": CLIENT_SECRET, "refresh_token": FIRST_REFRESH_TOKEN,
    })
    .to_string();
    let mut s = setup_on(
        "rolling",
        "refresh_token",
        &secret,
        1,
        Some(db.url.expose().to_string()),
        |_| {},
    )
    .await;
    let mut other = s.another_replica().await;
    let mut kept = Vec::new();
    for round in 0..6 {
        let serving = if round % 2 == 0 { &s.gw } else { &other };
        let (status, body) = s.get(&serving.client("sb-a", false)).await;
        assert_eq!(
            status,
            200,
            "round {round} on replica {}: {body}",
            round % 2
        );
        assert_eq!(s.endpoint.calls(), round + 1);
        // The replica that just rotated the token restarts.
        let fresh = s.another_replica().await;
        if round % 2 == 0 {
            stop(std::mem::replace(&mut s.gw, fresh), &mut kept);
        } else {
            stop(std::mem::replace(&mut other, fresh), &mut kept);
        }
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    assert_eq!(s.endpoint.refresh_tokens_issued.lock().unwrap().len(), 6);
    let view = s.credential_view().await;
    assert_eq!(
        view["version"], 1,
        "no start rewrote the credential: {view}"
    );
    stop(other, &mut kept);
    s.assert_no_secret_leaked(&[]).await;
    drop(s);
    db.drop().await;
}

#[tokio::test]
async fn invalid_grant_ends_the_credential_and_server_errors_are_retried() {
    // `sandgate_credential_refresh_total{outcome}` counts every gateway's refreshes: with
    // its own recorder, the difference is this test's refreshes only.
    let _metrics = own_metrics();
    let s = setup("ending", "client_credentials", CLIENT_SECRET, 1).await;
    let client = s.gw.client("sb-a", false);
    let transient_before = refresh_count(&s.metrics().await, "transient_error");

    // Two 503s, then a token: the request waits through the backoff and succeeds.
    s.endpoint.fail_next.store(2, Ordering::SeqCst);
    let (status, body) = s.get(&client).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(s.endpoint.calls(), 3);
    let metrics = s.metrics().await;
    assert_eq!(
        refresh_count(&metrics, "transient_error"),
        transient_before + 2,
        "{metrics}"
    );

    // Failing throughout: 503 credential_unavailable, and the next request tries again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    s.endpoint.fail_next.store(100, Ordering::SeqCst);
    let (status, body) = s.get(&client).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "credential_unavailable", "{body}");
    s.endpoint.fail_next.store(0, Ordering::SeqCst);

    // invalid_grant: 403, the credential ends, and no further call reaches the endpoint.
    s.endpoint.refuse.store(true, Ordering::SeqCst);
    let (status, body) = s.get(&client).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "credential_unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("invalid_grant"), "{message}");
    assert!(message.contains("\"ending\""), "{message}");
    let calls = s.endpoint.calls();
    let (status, _) = s.get(&client).await;
    assert_eq!(status, 403);
    assert_eq!(
        s.endpoint.calls(),
        calls,
        "an ended credential asks no more"
    );
    let view = s.credential_view().await;
    assert_eq!(view["token"]["ended"], true, "{view}");
    assert_eq!(view["token"]["last_refresh_outcome"], "rejected");
    assert!(view["token"]["last_refresh_error"]
        .as_str()
        .unwrap()
        .contains("invalid_grant"));
    let refused =
        s.gw.decisions(1)
            .await
            .into_iter()
            .filter(|r| r["code"] == "credential_unavailable")
            .count();
    assert!(refused >= 2);

    // Replacing the credential (a new secret) starts it again.
    s.endpoint.refuse.store(false, Ordering::SeqCst);
    let replaced = reqwest::Client::new()
        .put(s.gw.api("/v1/workspaces/ws-a/credentials/ending"))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({
            "secret": CLIENT_SECRET,
            "destinations": [{"host": "api.oauth.test", "ports": [s.origin.port()]}],
            "apply": s.credential_view().await["apply"],
            "placeholder_env": "API_TOKEN",
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(replaced.status(), 200, "{}", replaced.text().await.unwrap());
    let (status, _) = s.get(&client).await;
    assert_eq!(status, 200);
    s.assert_no_secret_leaked(&[]).await;
}

/// Token endpoints are reached through the proxy's own resolver and address guard: a
/// `token_url` whose host resolves to an address sandboxes may not reach (here loopback
/// outside `allow_private`) is never dialed, and the request is answered 503.
#[tokio::test]
async fn a_token_url_on_an_address_sandboxes_may_not_reach_is_not_dialed() {
    let s = setup_on(
        "guarded",
        "client_credentials",
        CLIENT_SECRET,
        60,
        None,
        |o| {
            // The origin stays reachable; the token host resolves outside what is allowed.
            o.hosts = vec![
                ("api.oauth.test", "127.0.0.1"),
                ("auth.oauth.test", "127.0.0.2"),
            ];
            o.extra_toml
                .push_str("\n[egress]\nallow_private = [\"127.0.0.1/32\"]\n");
        },
    )
    .await;
    let client = s.gw.client("sb-a", false);
    let (status, body) = s.get(&client).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "credential_unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("127.0.0.2"), "{message}");
    assert!(
        message.contains("may not reach"),
        "the guard refused it: {message}"
    );
    assert_eq!(s.endpoint.calls(), 0);
    assert_eq!(
        s.origin.count(),
        0,
        "nothing is forwarded without the credential"
    );
    s.assert_no_secret_leaked(&[]).await;
}

#[tokio::test]
async fn a_secret_that_does_not_fit_the_grant_is_refused_without_being_quoted() {
    let s = setup("checked", "client_credentials", CLIENT_SECRET, 60).await;
    let response = reqwest::Client::new()
        .post(s.gw.api("/v1/workspaces/ws-a/credentials"))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({
            "name": "rt",
            "secret": "{\"client_secret\": \"only-this-s3cr3t\"}",
            "destinations": [{"host": "api.oauth.test"}],
            "apply": {"type": "oauth2", "grant": "refresh_token",
                      "token_url": "https://auth.oauth.test/oauth/token", "client_id": "c"},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let text = response.text().await.unwrap();
    assert!(text.contains("refresh token"), "{text}");
    assert!(!text.contains("only-this-s3cr3t"));
    let http_url = reqwest::Client::new()
        .post(s.gw.api("/v1/workspaces/ws-a/credentials"))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({
            "name": "plain", "secret": "x",
            "destinations": [{"host": "api.oauth.test"}],
            "apply": {"type": "oauth2", "grant": "client_credentials",
                      "token_url": "http://auth.oauth.test/oauth/token", "client_id": "c"},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(http_url.status(), 400);
    assert!(http_url.text().await.unwrap().contains("apply.token_url"));
}

/// The GitHub App: an RSA key made for the test, the fake GitHub (`tests/fixtures`) that
/// verifies the App's JWT with the public key and serves a private repository over git's
/// smart HTTP, and `git clone` from the sandbox side with no token anywhere in it.
#[tokio::test]
async fn github_app_token_reaches_the_api_and_git_clone_works_without_a_token_inside() {
    capture_logs();
    init();
    let python = sdk::python();
    for module in ["jwt", "cryptography"] {
        if let Some(why) = sdk::missing(&python, module) {
            assert!(!in_ci(), "{why}");
            eprintln!("skipping outside CI: {why}");
            return;
        }
    }
    let Some(git) = which("git") else {
        assert!(!in_ci(), "git is not installed");
        eprintln!("skipping outside CI: no git");
        return;
    };
    let ca = TestCa::new();
    let work = tempfile::tempdir().unwrap();
    let (private_key, public_key) = rsa_key_pair(&python, work.path());
    let repos = work.path().join("repos");
    make_repo(&git, &repos.join("acme/private.git"), work.path());

    let (cert, key) = ca.server_pem(&["api.github.test", "github.test"]);
    let port_file = work.path().join("port");
    let fake_log = work.path().join("github.jsonl");
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/github_fake.py");
    let mut fake = ChildGuard(
        std::process::Command::new(&python)
            .arg(fixture)
            .args(["--cert", &path(&cert), "--key", &path(&key)])
            .args(["--port-file", &path(&port_file)])
            .args(["--app-id", "424242", "--installation-id", "9001"])
            .args(["--public-key", &path(&public_key), "--repos", &path(&repos)])
            .args(["--token-ttl", "3600", "--log", &path(&fake_log)])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let port = wait_port_file(&port_file, &mut fake.0).await;

    let extra_toml = format!(
        r#"{ADMIN_TOML}
[[credentials]]
workspace = "ws-a"
name = "gh"
secret_file = {private_key:?}
placeholder_env = "GITHUB_TOKEN"
destinations = [{{ host = "api.github.test", ports = [{port}] }}, {{ host = "github.test", ports = [{port}] }}]
apply = {{ type = "github_app", app_id = 424242, installation_id = 9001, api_url = "https://api.github.test:{port}" }}
"#,
        private_key = path(&private_key),
    );
    let gw = Gateway::start(GatewayOptions {
        identities: vec![IdentitySpec {
            id: "sb-a",
            workspace: "ws-a",
            allow_domains: vec!["api.github.test", "github.test"],
            credentials: vec!["gh"],
        }],
        hosts: vec![
            ("api.github.test", "127.0.0.1"),
            ("github.test", "127.0.0.1"),
        ],
        upstream_ca: Some(ca.pem_path.clone()),
        extra_toml,
        ..Default::default()
    })
    .await;

    // The API, with the sandbox's placeholder as its token (replaced by the real one).
    let env = gw.api_json("/v1/identities/sb-a/env", ADMIN).await;
    let placeholder = env["env"]["GITHUB_TOKEN"].as_str().unwrap().to_string();
    let client = gw.client("sb-a", true);
    let repo: serde_json::Value = client
        .get(format!("https://api.github.test:{port}/repos/acme/private"))
        .bearer_auth(&placeholder)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(repo["full_name"], "acme/private", "{repo}");

    // git clone through the proxy, trusting sandgate's CA, with no credential at all.
    let ca_file = work.path().join("sandgate-ca.pem");
    std::fs::write(&ca_file, &gw.sandgate_ca_pem).unwrap();
    let clone_dir = work.path().join("clone");
    let proxy = gw.proxy_url("sb-a", TOKEN);
    let git_path = git.clone();
    let url = format!("https://github.test:{port}/acme/private.git");
    let (clone_dir2, ca_file2) = (clone_dir.clone(), ca_file.clone());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(git_path)
            .args(["clone", "--quiet", &url, &path(&clone_dir2)])
            .env("HTTPS_PROXY", &proxy)
            .env("GIT_SSL_CAINFO", &ca_file2)
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", clone_dir2.parent().unwrap())
            .env_remove("GIT_ASKPASS")
            .env_remove("SSH_ASKPASS")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "git clone failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let readme = std::fs::read_to_string(clone_dir.join("README.md")).unwrap();
    assert_eq!(readme, "private contents\n");
    let config = std::fs::read_to_string(clone_dir.join(".git/config")).unwrap();
    assert!(!config.contains("ghs_"), "no token was stored by git");

    // The fake saw the JWT exchange once and every git request authenticated by Basic.
    let log: Vec<serde_json::Value> = std::fs::read_to_string(&fake_log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mints = log
        .iter()
        .filter(|r| r["path"].as_str().unwrap().ends_with("/access_tokens"))
        .count();
    assert_eq!(
        mints, 1,
        "one installation token for the API call and the clone"
    );
    let git_requests: Vec<&serde_json::Value> = log
        .iter()
        .filter(|r| r["path"].as_str().unwrap().starts_with("/acme/private.git"))
        .collect();
    assert!(git_requests.len() >= 2, "{log:?}");
    assert!(git_requests
        .iter()
        .all(|r| r["auth_kind"] == "basic" && r["token_ok"] == true));
    let api = log
        .iter()
        .find(|r| r["path"] == "/repos/acme/private")
        .unwrap();
    assert_eq!(api["auth_kind"], "bearer");

    let view = gw
        .api_json("/v1/workspaces/ws-a/credentials/gh", ADMIN)
        .await;
    assert_eq!(view["type"], "github_app");
    assert_eq!(view["token"]["last_refresh_outcome"], "ok");
    let logs = String::from_utf8_lossy(&captured_logs().lock().unwrap()).into_owned();
    let decisions = std::fs::read_to_string(&gw.decision_log).unwrap();
    let key_body = std::fs::read_to_string(&private_key).unwrap();
    let key_line = key_body.lines().nth(1).unwrap();
    for text in [&logs, &decisions, &view.to_string()] {
        assert!(!text.contains("ghs_"), "an installation token leaked");
        assert!(!text.contains(key_line), "the App key leaked");
    }
}

/// `sandgate_credential_refresh_total{outcome}` in a scrape (0 when absent).
fn refresh_count(metrics: &str, outcome: &str) -> u64 {
    let prefix = format!("sandgate_credential_refresh_total{{outcome=\"{outcome}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

fn path(p: &std::path::Path) -> String {
    p.display().to_string()
}

/// A PKCS#1 RSA key pair as GitHub issues App keys, made with the `cryptography` package.
fn rsa_key_pair(
    python: &std::path::Path,
    dir: &std::path::Path,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let private_key = dir.join("app.pem");
    let public_key = dir.join("app.pub.pem");
    let script = r#"
import sys
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
open(sys.argv[1], "wb").write(key.private_bytes(serialization.Encoding.PEM,
    serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()))
open(sys.argv[2], "wb").write(key.public_key().public_bytes(serialization.Encoding.PEM,
    serialization.PublicFormat.SubjectPublicKeyInfo))
"#;
    let status = std::process::Command::new(python)
        .args(["-c", script, &path(&private_key), &path(&public_key)])
        .status()
        .unwrap();
    assert!(status.success());
    (private_key, public_key)
}

/// A bare repository with one commit holding `README.md`.
fn make_repo(git: &std::path::Path, bare: &std::path::Path, scratch: &std::path::Path) {
    let src = scratch.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let run = |dir: &std::path::Path, args: &[&str]| {
        let out = std::process::Command::new(git)
            .current_dir(dir)
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", scratch)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&src, &["init", "--quiet", "-b", "main"]);
    std::fs::File::create(src.join("README.md"))
        .unwrap()
        .write_all(b"private contents\n")
        .unwrap();
    run(&src, &["add", "README.md"]);
    run(
        &src,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "--quiet",
            "-m",
            "init",
        ],
    );
    std::fs::create_dir_all(bare.parent().unwrap()).unwrap();
    run(
        scratch,
        &["clone", "--quiet", "--bare", &path(&src), &path(bare)],
    );
}
