//! Credential injection over real sockets: origins record what reaches them, sandboxes are
//! reqwest clients that trust only sandgate's CA, the database is a real SQLite file.

use std::time::Duration;

use crate::common::*;

const SECRET_X: &str = "s3cr3t-X-7f1e9a0c";
const SECRET_X2: &str = "s3cr3t-X-rotated-55aa";
const SECRET_B: &str = "s3cr3t-B-0d0d0d0d";
const ADMIN_A: &str = "api-token-ws-a-0123456789";
const ADMIN_B: &str = "api-token-ws-b-0123456789";

struct Setup {
    origin: Origin,
    gw: Gateway,
    _ca: TestCa,
}

async fn setup(extra_policies: Vec<(&'static str, String)>) -> Setup {
    init();
    let ca = TestCa::new();
    let origin = start_origin(Some(ca.server_config(&["api.a.test", "api.b.test"]))).await;
    let secrets = tempfile::tempdir().unwrap().keep();
    std::fs::write(secrets.join("x"), format!("{SECRET_X}\n")).unwrap();
    std::fs::write(secrets.join("b"), SECRET_B).unwrap();
    let port = origin.port();
    let extra_toml = format!(
        r#"
[[api.tokens]]
token = "{ADMIN_A}"
principal = "alice"
workspace = "ws-a"
[[api.tokens]]
token = "{ADMIN_B}"
principal = "bob"
workspace = "ws-b"

[[credentials]]
workspace = "ws-a"
name = "x"
secret_file = {x:?}
placeholder_env = "X_TOKEN"
destinations = [{{ host = "api.a.test", ports = [{port}] }}]
apply = {{ type = "header", name = "authorization", template = "Bearer {{secret}}" }}

[[credentials]]
workspace = "ws-b"
name = "b"
secret_file = {b:?}
destinations = [{{ host = "api.b.test", ports = [{port}] }}]
apply = {{ type = "header", name = "x-api-key", template = "{{secret}}" }}
"#,
        x = secrets.join("x").display().to_string(),
        b = secrets.join("b").display().to_string(),
    );
    let gw = Gateway::start(GatewayOptions {
        identities: vec![
            IdentitySpec {
                id: "sb-a",
                workspace: "ws-a",
                allow_domains: vec!["api.a.test", "api.b.test"],
                credentials: vec!["x"],
            },
            IdentitySpec {
                id: "sb-b",
                workspace: "ws-b",
                allow_domains: vec!["api.a.test", "api.b.test"],
                credentials: vec!["b"],
            },
        ],
        upstream_ca: Some(ca.pem_path.clone()),
        extra_policies,
        extra_toml,
        ..Default::default()
    })
    .await;
    Setup {
        origin,
        gw,
        _ca: ca,
    }
}

async fn placeholder_of(
    gw: &Gateway,
    id: &str,
    api_token: &str,
    name: &str,
) -> (String, serde_json::Value) {
    let env: serde_json::Value = reqwest::Client::new()
        .get(gw.api(&format!("/v1/identities/{id}/env")))
        .bearer_auth(api_token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    (env["placeholders"][name].as_str().unwrap().to_string(), env)
}

#[tokio::test]
async fn bound_credential_is_injected_for_its_destination_over_h1_and_h2() {
    let s = setup(vec![]).await;
    let url = format!("https://api.a.test:{}/repos", s.origin.port());
    for http1_only in [true, false] {
        let response =
            s.gw.client("sb-a", http1_only)
                .get(&url)
                .header("authorization", "Bearer sandbox-supplied")
                .send()
                .await
                .unwrap();
        let status = response.status();
        assert_eq!(status, 200, "{:?}", response.text().await);
        let seen = s.origin.last().unwrap();
        assert_eq!(seen.headers["authorization"], format!("Bearer {SECRET_X}"));
        let expected = if http1_only {
            reqwest::Version::HTTP_11
        } else {
            reqwest::Version::HTTP_2
        };
        assert_eq!(response.version(), expected);
    }
    // Another destination the egress policy allows gets no secret.
    let response =
        s.gw.client("sb-a", false)
            .get(format!("https://api.b.test:{}/", s.origin.port()))
            .send()
            .await
            .unwrap();
    assert_eq!(response.status(), 200);
    let seen = s.origin.last().unwrap();
    assert!(!seen.headers.contains_key("authorization"));
    assert!(!seen.headers.values().any(|v| v.contains(SECRET_X)));
    let records = s.gw.decisions(3).await;
    assert!(records
        .iter()
        .any(|r| r["host"] == "api.a.test" && r["credentials"] == serde_json::json!(["x"])));
    s.gw.server.shutdown();
}

#[tokio::test]
async fn placeholders_resolve_only_for_their_destination_and_sandbox() {
    let s = setup(vec![]).await;
    let (placeholder, env) = placeholder_of(&s.gw, "sb-a", ADMIN_A, "x").await;
    assert!(placeholder.starts_with("sgph_"));
    assert_eq!(env["env"]["X_TOKEN"], placeholder.as_str());
    assert!(
        !env.to_string().contains(SECRET_X),
        "the env endpoint never shows the secret"
    );
    assert!(!env.to_string().contains(TOKEN), "nor the proxy token");

    // In its declared slot (credential x goes into `authorization`), for the bound
    // destination: the slot gets the real credential.
    let response =
        s.gw.client("sb-a", false)
            .get(format!("https://api.a.test:{}/q?x=1", s.origin.port()))
            .header("authorization", format!("Bearer {placeholder}"))
            .send()
            .await
            .unwrap();
    assert_eq!(response.status(), 200);
    let seen = s.origin.last().unwrap();
    assert_eq!(seen.headers["authorization"], format!("Bearer {SECRET_X}"));
    assert_eq!(seen.path, "/q?x=1");

    // Anywhere else, even for the bound destination (a header or a query value an API may
    // echo back), it is refused and nothing is forwarded.
    let before = s.origin.count();
    for (path, header) in [
        (format!("/q?token={placeholder}"), None),
        ("/q".to_string(), Some(format!("key={placeholder}"))),
    ] {
        let mut request =
            s.gw.client("sb-a", false)
                .get(format!("https://api.a.test:{}{path}", s.origin.port()));
        if let Some(value) = header {
            request = request.header("x-custom", value);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 403);
        assert_eq!(
            response.headers()["x-sandgate-error"],
            "credential_destination_mismatch"
        );
        assert!(!response.text().await.unwrap().contains(SECRET_X));
    }
    assert_eq!(
        s.origin.count(),
        before,
        "nothing out of slot was forwarded"
    );

    // The same placeholder towards another destination is refused and never forwarded.
    let before = s.origin.count();
    let response =
        s.gw.client("sb-a", false)
            .get(format!("https://api.b.test:{}/", s.origin.port()))
            .header("authorization", format!("Bearer {placeholder}"))
            .send()
            .await
            .unwrap();
    assert_eq!(response.status(), 403);
    assert_eq!(
        response.headers()["x-sandgate-error"],
        "credential_destination_mismatch"
    );
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "credential_destination_mismatch");
    assert_eq!(s.origin.count(), before, "api.b.test received nothing");

    // Hidden inside basic auth it is found too.
    use base64::Engine as _;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("user:{placeholder}"));
    let response =
        s.gw.client("sb-a", false)
            .get(format!("https://api.b.test:{}/", s.origin.port()))
            .header("authorization", format!("Basic {basic}"))
            .send()
            .await
            .unwrap();
    assert_eq!(response.status(), 403);
    assert_eq!(s.origin.count(), before);

    // Workspace B's sandbox, even knowing A's placeholder, cannot use it at A's destination.
    let response =
        s.gw.client("sb-b", false)
            .get(format!("https://api.a.test:{}/", s.origin.port()))
            .header("authorization", format!("Bearer {placeholder}"))
            .send()
            .await
            .unwrap();
    assert_eq!(response.status(), 403);
    assert_eq!(s.origin.count(), before);
    // Nor can B read A's identity environment.
    let response = reqwest::Client::new()
        .get(s.gw.api("/v1/identities/sb-a/env"))
        .bearer_auth(ADMIN_B)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    s.gw.server.shutdown();
}

#[tokio::test]
async fn a_sandbox_cannot_bind_another_workspaces_credential() {
    init();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("x"), SECRET_X).unwrap();
    let err = Gateway::try_start(GatewayOptions {
        identities: vec![IdentitySpec {
            id: "sb-b",
            workspace: "ws-b",
            allow_domains: vec!["api.a.test"],
            credentials: vec!["x"],
        }],
        extra_toml: format!(
            "[[credentials]]\nworkspace = \"ws-a\"\nname = \"x\"\nsecret_file = {:?}\ndestinations = [{{ host = \"api.a.test\" }}]\napply = {{ type = \"query\", param = \"key\" }}\n",
            dir.path().join("x").display().to_string()
        ),
        ..Default::default()
    })
    .await
    .err()
    .expect("binding a foreign credential must fail");
    assert!(err.contains("egress.identities[0].credentials[0]"), "{err}");
    assert!(
        err.contains("no credential \"x\" in workspace \"ws-b\""),
        "{err}"
    );
    assert!(!err.contains(SECRET_X));
}

const NO_POST: &str = r#"package sandgate.credential
import rego.v1

deny contains "credential x may only be used for reads" if {
	input.credential.name == "x"
	input.request.method != "GET"
}
"#;

#[tokio::test]
async fn credential_policy_allows_get_and_refuses_post() {
    let s = setup(vec![("no_post.rego", NO_POST.to_string())]).await;
    let client = s.gw.client("sb-a", false);
    let url = format!("https://api.a.test:{}/items", s.origin.port());
    let response = client.get(&url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        s.origin.last().unwrap().headers["authorization"],
        format!("Bearer {SECRET_X}")
    );
    let before = s.origin.count();
    let response = client.post(&url).body("{}").send().await.unwrap();
    assert_eq!(response.status(), 403);
    assert_eq!(response.headers()["x-sandgate-error"], "credential_denied");
    let body: serde_json::Value = response.json().await.unwrap();
    assert!(body["error"]["details"]["reasons"][0]
        .as_str()
        .unwrap()
        .contains("only be used for reads"));
    assert_eq!(
        s.origin.count(),
        before,
        "the POST was not forwarded without the credential"
    );
    s.gw.server.shutdown();
}

#[tokio::test]
async fn credentials_api_never_returns_secrets_and_rotation_applies_without_restart() {
    let s = setup(vec![]).await;
    let api = reqwest::Client::new();
    let base = s.gw.api("/v1/workspaces/ws-a/credentials");

    // Unauthenticated and foreign-workspace callers are refused.
    assert_eq!(api.get(&base).send().await.unwrap().status(), 401);
    assert_eq!(
        api.get(&base)
            .bearer_auth(ADMIN_B)
            .send()
            .await
            .unwrap()
            .status(),
        403
    );

    let listed: serde_json::Value = api
        .get(&base)
        .bearer_auth(ADMIN_A)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["credentials"][0]["name"], "x");
    assert!(!listed.to_string().contains(SECRET_X));

    // Create a new one at runtime.
    let created = api
        .post(&base)
        .bearer_auth(ADMIN_A)
        .json(&serde_json::json!({
            "name": "runtime",
            "secret": "runtime-secret-abc123",
            "destinations": [{"host": "api.b.test", "ports": [s.origin.port()]}],
            "apply": {"type": "query", "param": "key"}
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let text = created.text().await.unwrap();
    assert!(!text.contains("runtime-secret-abc123"), "{text}");
    let again = api
        .post(&base)
        .bearer_auth(ADMIN_A)
        .json(&serde_json::json!({
            "name": "runtime", "secret": "y",
            "destinations": [{"host": "api.b.test"}], "apply": {"type": "query", "param": "key"}
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 409);
    // A malformed body is refused without echoing what was sent.
    let bad = api
        .post(&base)
        .bearer_auth(ADMIN_A)
        .header("content-type", "application/json")
        .body(r#"{"name": "z", "secret": {"nested": "leaky-secret-value"}, "destinations": [], "apply": {"type": "query", "param": "k"}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let text = bad.text().await.unwrap();
    assert!(!text.contains("leaky-secret-value"), "{text}");
    assert!(text.contains("invalid_request"));

    // Rotate x: the next request carries the new secret, no restart.
    let rotated = api
        .put(format!("{base}/x"))
        .bearer_auth(ADMIN_A)
        .json(&serde_json::json!({
            "secret": SECRET_X2,
            "destinations": [{"host": "api.a.test", "ports": [s.origin.port()]}],
            "apply": {"type": "header", "name": "authorization", "template": "Bearer {secret}"},
            "placeholder_env": "X_TOKEN"
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(rotated.status(), 200);
    let response =
        s.gw.client("sb-a", false)
            .get(format!("https://api.a.test:{}/", s.origin.port()))
            .send()
            .await
            .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        s.origin.last().unwrap().headers["authorization"],
        format!("Bearer {SECRET_X2}")
    );

    // Delete: the credential is no longer applied.
    let deleted = api
        .delete(format!("{base}/x"))
        .bearer_auth(ADMIN_A)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let response =
        s.gw.client("sb-a", false)
            .get(format!("https://api.a.test:{}/", s.origin.port()))
            .send()
            .await
            .unwrap();
    assert_eq!(response.status(), 200);
    assert!(!s
        .origin
        .last()
        .unwrap()
        .headers
        .contains_key("authorization"));

    // The database holds no secret in plain text (file plus WAL).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut bytes = Vec::new();
    for entry in std::fs::read_dir(s.gw.dir.path().join("data")).unwrap() {
        bytes.extend(std::fs::read(entry.unwrap().path()).unwrap());
    }
    assert!(bytes.len() > 1000, "the database was written");
    for secret in [SECRET_X, SECRET_X2, SECRET_B, "runtime-secret-abc123"] {
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{secret} in plain text"
        );
    }
    s.gw.server.shutdown();
}

#[tokio::test]
async fn secrets_survive_restart_sealed() {
    let s = setup(vec![]).await;
    let api = reqwest::Client::new();
    let created = api
        .post(s.gw.api("/v1/workspaces/ws-a/credentials"))
        .bearer_auth(ADMIN_A)
        .json(&serde_json::json!({
            "name": "persisted",
            "secret": "persisted-secret-123",
            "destinations": [{"host": "api.a.test", "ports": [s.origin.port()], "path_prefix": "/p/"}],
            "apply": {"type": "header", "name": "x-persisted", "template": "{secret}"}
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let credentials = &s.gw.server.egress.credentials;
    assert_eq!(
        credentials
            .get("ws-a", "persisted")
            .unwrap()
            .secret
            .expose(),
        "persisted-secret-123"
    );
    // A second store over the same database and key opens it again.
    let store = sandgate::store::Store::open_sqlite(&s.gw.dir.path().join("data/sandgate.db"))
        .await
        .unwrap();
    let key = std::sync::Arc::new(
        sandgate::credentials::MasterKey::load(&s.gw.dir.path().join("data/master.key")).unwrap(),
    );
    let reopened = sandgate::credentials::CredentialStore::load(key, store, &[])
        .await
        .unwrap();
    assert_eq!(
        reopened.get("ws-a", "persisted").unwrap().secret.expose(),
        "persisted-secret-123"
    );
    s.gw.server.shutdown();
}

/// Two creates of one name race: exactly one answers 201, the other 409 `already_exists`,
/// and the secret in force is the winner's (it was not silently replaced by the loser's).
#[tokio::test]
async fn concurrent_creates_of_one_name_have_exactly_one_winner() {
    let s = setup(vec![]).await;
    let base = s.gw.api("/v1/workspaces/ws-a/credentials");
    let port = s.origin.port();
    for round in 0..10 {
        let name = format!("race-{round}");
        let create = |secret: String| {
            let base = base.clone();
            let name = name.clone();
            async move {
                let response = reqwest::Client::new()
                    .post(&base)
                    .bearer_auth(ADMIN_A)
                    .json(&serde_json::json!({"name": name, "secret": secret,
                        "destinations": [{"host": "api.a.test", "ports": [port]}],
                        "apply": {"type": "header", "name": "x-race", "template": "{secret}"}}))
                    .send()
                    .await
                    .unwrap();
                (response.status().as_u16(), secret)
            }
        };
        let (a, b) = tokio::join!(
            create(format!("secret-a-{round}")),
            create(format!("secret-b-{round}"))
        );
        let mut statuses = [a.0, b.0];
        statuses.sort();
        assert_eq!(statuses, [201, 409], "round {round}");
        let winner = if a.0 == 201 { a.1 } else { b.1 };
        let store = sandgate::store::Store::open_sqlite(&s.gw.dir.path().join("data/sandgate.db"))
            .await
            .unwrap();
        let key = std::sync::Arc::new(
            sandgate::credentials::MasterKey::load(&s.gw.dir.path().join("data/master.key"))
                .unwrap(),
        );
        let stored = sandgate::credentials::CredentialStore::load(key, store, &[])
            .await
            .unwrap();
        assert_eq!(stored.get("ws-a", &name).unwrap().secret.expose(), winner);
    }
    s.gw.server.shutdown();
}

/// A credential another writer (another replica, sharing the database) created after this
/// gateway loaded is not overwritten by a create here: the create answers 409.
#[tokio::test]
async fn a_create_never_replaces_a_row_it_did_not_see() {
    let s = setup(vec![]).await;
    let db = s.gw.dir.path().join("data/sandgate.db");
    let key = std::sync::Arc::new(
        sandgate::credentials::MasterKey::load(&s.gw.dir.path().join("data/master.key")).unwrap(),
    );
    let other = sandgate::credentials::CredentialStore::load(
        key.clone(),
        sandgate::store::Store::open_sqlite(&db).await.unwrap(),
        &[],
    )
    .await
    .unwrap();
    let port = s.origin.port();
    let meta: sandgate::credentials::CredentialMeta = serde_json::from_value(serde_json::json!({
        "workspace": "ws-a", "name": "elsewhere",
        "destinations": [{"host": "api.a.test", "ports": [port]}],
        "apply": {"type": "header", "name": "x-other", "template": "{secret}"}}))
    .unwrap();
    other
        .put(
            meta,
            Some(sandgate::credentials::Secret::new("first-writer")),
            false,
        )
        .await
        .unwrap();
    let response = reqwest::Client::new()
        .post(s.gw.api("/v1/workspaces/ws-a/credentials"))
        .bearer_auth(ADMIN_A)
        .json(
            &serde_json::json!({"name": "elsewhere", "secret": "second-writer",
            "destinations": [{"host": "api.a.test", "ports": [port]}],
            "apply": {"type": "header", "name": "x-other", "template": "{secret}"}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 409);
    let reread = sandgate::credentials::CredentialStore::load(
        key,
        sandgate::store::Store::open_sqlite(&db).await.unwrap(),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(
        reread.get("ws-a", "elsewhere").unwrap().secret.expose(),
        "first-writer"
    );
    s.gw.server.shutdown();
}
