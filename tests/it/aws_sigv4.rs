//! AWS SigV4 re-signing over real sockets, checked by an implementation that is not
//! sandgate's: the S3-like origin (`tests/fixtures/s3_origin.py`) verifies every signature
//! with botocore's own signer and the real keys, and the client is boto3
//! (`tests/fixtures/aws_client.py`) going through the proxy with only the placeholders
//! sandgate gave the sandbox.

use std::path::Path;
use std::process::Command;

use crate::common::*;

const ACCESS_KEY: &str = "AKIAREALKEY7QX2M4N5P";
const SECRET_KEY: &str = "rEaLsEcReT/kEy+0123456789abcdefghijKLMNOP";
const SESSION_TOKEN: &str = "FwoGZXIvYXdzEReal//SessionToken0123456789==";
const ADMIN: &str = "api-token-ws-a-0123456789";

/// Steps the policy below refuses.
const DENY_DELETE: &str = r#"package sandgate.credential

import rego.v1

deny contains msg if {
	input.credential.type == "aws_sigv4"
	input.request.aws.action == "s3:DeleteObject"
	msg := sprintf("%s on %s/%s is not allowed", [input.request.aws.operation, input.request.aws.bucket, input.request.aws.key])
}
"#;

struct Setup {
    gw: Gateway,
    s3_port: u16,
    origin: Origin,
    s3_log: std::path::PathBuf,
    work: tempfile::TempDir,
    python: std::path::PathBuf,
    _s3: ChildGuard,
    _ca: TestCa,
}

/// What a test adds to the gateway [`setup`] makes.
#[derive(Default)]
struct Extra {
    /// More names the S3 origin answers for (its certificate, `[dns.hosts]`, the sandbox's
    /// allowed domains).
    names: Vec<&'static str>,
    /// More `[[credentials]]`: `{port}` stands for the S3 origin's port, `{keys}` for the
    /// key file.
    credentials_toml: &'static str,
    /// Their names, bound to the sandbox.
    credentials: Vec<&'static str>,
    /// Policy files instead of [`DENY_DELETE`].
    policies: Option<Vec<(&'static str, String)>>,
    /// More `s3_origin.py` arguments (later ones win).
    origin_args: Vec<&'static str>,
}

/// `None` outside CI when boto3 is missing (CI installs it and fails instead).
async fn setup() -> Option<Setup> {
    setup_with(Extra::default()).await
}

async fn setup_with(extra: Extra) -> Option<Setup> {
    capture_logs();
    init();
    let python = sdk::python();
    for module in ["boto3", "botocore"] {
        if let Some(why) = sdk::missing(&python, module) {
            assert!(!in_ci(), "{why}");
            eprintln!("skipping outside CI: {why}");
            return None;
        }
    }
    let ca = TestCa::new();
    let work = tempfile::tempdir().unwrap();
    let mut names = vec!["s3.test", "sts.test"];
    names.extend(&extra.names);
    let (cert, key) = ca.server_pem(&names);
    let port_file = work.path().join("port");
    let s3_log = work.path().join("s3.jsonl");
    let mut s3 = ChildGuard(
        Command::new(&python)
            .arg(fixture("s3_origin.py"))
            .args(["--cert", &p(&cert), "--key", &p(&key)])
            .args(["--port-file", &p(&port_file), "--log", &p(&s3_log)])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .args(["--session-token", SESSION_TOKEN])
            .args(&extra.origin_args)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let s3_port = wait_port_file(&port_file, &mut s3.0).await;
    let origin = start_origin(Some(ca.server_config(&["api.a.test"]))).await;
    let keys = serde_json::json!({
        "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY,
        "session_token": SESSION_TOKEN,
    });
    let keys_file = work.path().join("aws.json");
    std::fs::write(&keys_file, keys.to_string()).unwrap();
    let more_credentials = extra
        .credentials_toml
        .replace("{port}", &s3_port.to_string())
        .replace("{keys}", &format!("{:?}", p(&keys_file)));
    let extra_toml = format!(
        r#"
[[api.tokens]]
token = "{ADMIN}"
principal = "alice"
workspace = "ws-a"

[[credentials]]
workspace = "ws-a"
name = "s3"
secret_file = {keys:?}
destinations = [{{ host = "s3.test", ports = [{s3_port}] }}]
apply = {{ type = "aws_sigv4", service = "s3", region = "us-east-1", endpoint = "s3.test" }}

[[credentials]]
workspace = "ws-a"
name = "sts"
secret_file = {keys:?}
destinations = [{{ host = "sts.test", ports = [{s3_port}] }}]
apply = {{ type = "aws_sigv4", service = "sts", region = "us-east-1" }}
{more_credentials}"#,
        keys = p(&keys_file),
    );
    let mut allow_domains = names.clone();
    allow_domains.push("api.a.test");
    let mut credentials = vec!["s3", "sts"];
    credentials.extend(&extra.credentials);
    let mut hosts: Vec<(&'static str, &'static str)> =
        names.iter().map(|name| (*name, "127.0.0.1")).collect();
    hosts.push(("api.a.test", "127.0.0.1"));
    let gw = Gateway::start(GatewayOptions {
        identities: vec![IdentitySpec {
            id: "sb-a",
            workspace: "ws-a",
            allow_domains,
            credentials,
        }],
        hosts,
        upstream_ca: Some(ca.pem_path.clone()),
        extra_policies: extra
            .policies
            .unwrap_or_else(|| vec![("deny_delete.rego", DENY_DELETE.to_string())]),
        extra_toml,
        ..Default::default()
    })
    .await;
    Some(Setup {
        gw,
        s3_port,
        origin,
        s3_log,
        work,
        python,
        _s3: s3,
        _ca: ca,
    })
}

fn p(path: &Path) -> String {
    path.display().to_string()
}

impl Setup {
    /// The sandbox's environment from the API, with `credential`'s placeholder as the AWS
    /// keys (each AWS credential sets them; a sandbox binds one per SDK client).
    async fn sandbox_env(&self, credential: &str) -> Vec<(String, String)> {
        let env = self.gw.api_json("/v1/identities/sb-a/env", ADMIN).await;
        let placeholder = env["placeholders"][credential]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(env["env"]["AWS_REGION"], "us-east-1");
        assert!(env["env"]["AWS_ACCESS_KEY_ID"]
            .as_str()
            .unwrap()
            .starts_with("sgph_"));
        let ca = self.work.path().join("sandgate-ca.pem");
        std::fs::write(&ca, &self.gw.sandgate_ca_pem).unwrap();
        vec![
            ("HTTPS_PROXY".into(), self.gw.proxy_url("sb-a", TOKEN)),
            ("AWS_CA_BUNDLE".into(), p(&ca)),
            ("AWS_ACCESS_KEY_ID".into(), placeholder.clone()),
            ("AWS_SECRET_ACCESS_KEY".into(), placeholder),
        ]
    }

    /// Runs boto3 through the proxy; one JSON result per step.
    async fn boto3(
        &self,
        credential: &str,
        endpoint: &str,
        steps: &[&str],
    ) -> Vec<serde_json::Value> {
        self.boto3_addressing(credential, endpoint, "path", steps)
            .await
    }

    /// [`Setup::boto3`] with S3 `addressing` `path` or `virtual`.
    async fn boto3_addressing(
        &self,
        credential: &str,
        endpoint: &str,
        addressing: &str,
        steps: &[&str],
    ) -> Vec<serde_json::Value> {
        let env = self.sandbox_env(credential).await;
        let mut command = Command::new(&self.python);
        command
            .arg(fixture("aws_client.py"))
            .args(["--endpoint", endpoint, "--region", "us-east-1"])
            .args(["--addressing", addressing])
            .args(steps)
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_PROFILE")
            .env("AWS_CONFIG_FILE", "/dev/null")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
            .envs(env);
        let out = tokio::task::spawn_blocking(move || command.output().unwrap())
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let results: Vec<serde_json::Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            results.len(),
            steps.len(),
            "stdout {stdout}\nstderr {}",
            String::from_utf8_lossy(&out.stderr)
        );
        results
    }

    /// Neither the real secret key nor the session token is in any log line, decision
    /// record, metric or API answer.
    async fn assert_no_secret_leaked(&self) {
        let logs = String::from_utf8_lossy(&captured_logs().lock().unwrap()).into_owned();
        let texts = [
            logs,
            std::fs::read_to_string(&self.gw.decision_log).unwrap(),
            self.gw.api_get("/metrics", ADMIN).await,
            self.gw
                .api_get("/v1/workspaces/ws-a/credentials", ADMIN)
                .await,
            self.gw
                .api_get("/v1/workspaces/ws-a/credentials/s3", ADMIN)
                .await,
            self.gw.api_get("/v1/identities/sb-a/env", ADMIN).await,
        ];
        assert!(
            !texts[0].is_empty(),
            "no log was captured: the check would prove nothing"
        );
        assert!(texts[4].contains("aws_sigv4"), "{}", texts[4]);
        for text in &texts {
            for secret in [SECRET_KEY, SESSION_TOKEN] {
                assert!(!text.contains(secret), "a secret leaked");
            }
        }
    }

    fn s3_log(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.s3_log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

#[tokio::test]
async fn boto3_s3_get_put_and_chunked_upload_are_re_signed_with_the_real_key() {
    let Some(s) = setup().await else { return };
    let endpoint = format!("https://s3.test:{}", s.s3_port);
    let steps = [
        "create-bucket:bkt",
        "put:bkt/hello.txt=hello from the sandbox",
        "put-plain:bkt/plain.txt=a classic signed payload",
        "put-stream:bkt/big.bin=200000",
        "get:bkt/hello.txt",
        "get:bkt/big.bin",
        "list:bkt",
    ];
    let results = s.boto3("s3", &endpoint, &steps).await;
    for r in &results {
        assert_eq!(r["ok"], true, "{r}");
    }
    assert_eq!(results[5]["length"], 200000, "{}", results[5]);
    let listed = results[6].to_string();
    assert!(
        listed.contains("big.bin") && listed.contains("plain.txt"),
        "{listed}"
    );

    let log = s.s3_log();
    assert_eq!(log.len(), steps.len(), "{log:?}");
    for record in &log {
        assert_eq!(
            record["verified"], true,
            "botocore refused a signature: {record}"
        );
        let auth = record["headers"]["authorization"].as_str().unwrap();
        assert!(
            auth.contains(&format!("Credential={ACCESS_KEY}/")),
            "{auth}"
        );
        assert!(auth.contains("/us-east-1/s3/aws4_request"), "{auth}");
        assert!(
            !record.to_string().contains("sgph_"),
            "a placeholder reached the origin"
        );
        assert_eq!(record["headers"]["x-amz-security-token"], SESSION_TOKEN);
    }
    // The three payload rules were all exercised: a hex hash, the unsigned streaming
    // trailer (aws-chunked), and the empty-body hash of a GET.
    let hashes: Vec<&str> = log
        .iter()
        .map(|r| r["headers"]["x-amz-content-sha256"].as_str().unwrap())
        .collect();
    assert!(
        hashes.contains(&"STREAMING-UNSIGNED-PAYLOAD-TRAILER"),
        "{hashes:?}"
    );
    assert!(
        hashes.iter().any(|h| h.len() == 64 && *h != EMPTY_SHA256),
        "{hashes:?}"
    );
    assert!(hashes.contains(&EMPTY_SHA256), "{hashes:?}");

    let records = s.gw.decisions(steps.len()).await;
    let applied: Vec<&serde_json::Value> = records
        .iter()
        .filter(|r| r["credentials"][0] == "s3")
        .collect();
    assert_eq!(applied.len(), steps.len());
    assert!(applied
        .iter()
        .all(|r| r["credential_types"][0] == "aws_sigv4"));
    s.assert_no_secret_leaked().await;
}

const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

#[tokio::test]
async fn the_policy_sees_the_s3_operation_and_refuses_delete_object() {
    let Some(s) = setup().await else { return };
    let endpoint = format!("https://s3.test:{}", s.s3_port);
    let results = s
        .boto3(
            "s3",
            &endpoint,
            &[
                "put:keep/doc.txt=keep me",
                "delete:keep/doc.txt",
                "get:keep/doc.txt",
            ],
        )
        .await;
    assert_eq!(results[0]["ok"], true, "{}", results[0]);
    assert_eq!(results[1]["ok"], false, "{}", results[1]);
    assert_eq!(results[1]["status"], 403, "{}", results[1]);
    assert_eq!(
        results[2]["ok"], true,
        "the object survived: {}",
        results[2]
    );
    let log = s.s3_log();
    assert!(
        log.iter().all(|r| r["method"] != "DELETE"),
        "the refused delete reached the origin: {log:?}"
    );
    let denied: Vec<serde_json::Value> =
        s.gw.decisions(3)
            .await
            .into_iter()
            .filter(|r| r["code"] == "credential_denied")
            .collect();
    assert_eq!(denied.len(), 1);
    let reasons = denied[0]["reasons"].to_string();
    assert!(
        reasons.contains("DeleteObject on keep/doc.txt"),
        "{reasons}"
    );
}

#[tokio::test]
async fn body_signing_services_are_re_signed_over_the_body_hash() {
    let Some(s) = setup().await else { return };
    // STS signs the form body itself (no x-amz-content-sha256): the proxy hashes it.
    let results = s
        .boto3("sts", &format!("https://sts.test:{}", s.s3_port), &["sts"])
        .await;
    assert_eq!(results[0]["ok"], true, "{}", results[0]);
    let log = s.s3_log();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0]["verified"], true, "{}", log[0]);
    assert!(log[0]["headers"].get("x-amz-content-sha256").is_none());
}

#[tokio::test]
async fn a_placeholder_key_sent_to_another_host_is_refused() {
    let Some(s) = setup().await else { return };
    // boto3 signs for api.a.test with the S3 placeholder: that credential does not apply
    // there, so its placeholder is out of place and nothing is forwarded.
    let results = s
        .boto3(
            "s3",
            &format!("https://api.a.test:{}", s.origin.port()),
            &["get:bkt/hello.txt"],
        )
        .await;
    assert_eq!(results[0]["ok"], false);
    assert_eq!(results[0]["status"], 403, "{}", results[0]);
    assert_eq!(s.origin.count(), 0, "nothing reached the other host");
    let refused =
        s.gw.decisions(1)
            .await
            .into_iter()
            .filter(|r| r["code"] == "credential_destination_mismatch")
            .count();
    assert_eq!(refused, 1);
}

#[tokio::test]
async fn signed_streaming_uploads_have_every_chunk_signed_again() {
    let Some(s) = setup().await else { return };
    let endpoint = format!("https://s3.test:{}", s.s3_port);
    // Chunk signatures chain from the request's signature: the proxy's new signature
    // voids every one the sandbox computed, so each chunk (and the trailer) is signed again.
    let steps = [
        "create-bucket:chunks",
        "put-signed-chunks:chunks/x=200000:65536",
        "put-signed-chunks-trailer:chunks/y=150001:8192",
        "get:chunks/x",
        "get:chunks/y",
    ];
    let results = s.boto3("s3", &endpoint, &steps).await;
    for r in &results {
        assert_eq!(r["ok"], true, "{r}");
    }
    assert_eq!(results[1]["sha256"], results[3]["sha256"]);
    assert_eq!(results[2]["sha256"], results[4]["sha256"]);
    let log = s.s3_log();
    let uploads: Vec<&serde_json::Value> = log
        .iter()
        .filter(|r| r["chunk_signatures_verified"] == true)
        .collect();
    assert_eq!(uploads.len(), 2, "{log:?}");
    assert_eq!(uploads[0]["chunks"], 5);
    assert_eq!(uploads[1]["chunks"], 20);
    assert_eq!(uploads[1]["trailer_signature_verified"], true);
    assert!(!log.iter().any(|r| r.to_string().contains("sgph_")));
    s.assert_no_secret_leaked().await;
}

/// An S3-compatible service (R2, MinIO, a custom endpoint) addressed virtual-hosted, by boto3
/// itself: with the credential's `endpoint` set, `bucket.<endpoint>/keep/v.txt` is bucket
/// `bucket`, key `keep/v.txt` (not bucket `keep`), so a deny on bucket "bucket" holds and
/// another bucket is not refused. Without `endpoint` the host could be either style: the
/// bundled policy refuses the request rather than let a bucket rule guess.
#[tokio::test]
async fn s3_compatible_virtual_hosted_requests_reach_the_policy_with_their_bucket() {
    const DENY_BUCKET: &str = r#"package sandgate.credential

import rego.v1

deny contains msg if {
	input.credential.type == "aws_sigv4"
	input.request.aws.bucket == "bucket"
	input.request.aws.action == "s3:DeleteObject"
	msg := sprintf("%s in bucket %s (key %s) is not allowed", [input.request.aws.operation, input.request.aws.bucket, input.request.aws.key])
}
"#;
    let Some(s) = setup_with(Extra {
        names: vec![
            "s3.example-compatible.test",
            "bucket.s3.example-compatible.test",
            "other.s3.example-compatible.test",
            "bucket.s3.unknown-compatible.test",
        ],
        credentials_toml: r#"
[[credentials]]
workspace = "ws-a"
name = "compatible"
secret_file = {keys}
destinations = [{ host = "s3.example-compatible.test", ports = [{port}] }, { host = "*.s3.example-compatible.test", ports = [{port}] }]
apply = { type = "aws_sigv4", service = "s3", region = "us-east-1", endpoint = "s3.example-compatible.test" }

[[credentials]]
workspace = "ws-a"
name = "unknown"
secret_file = {keys}
destinations = [{ host = "*.s3.unknown-compatible.test", ports = [{port}] }]
apply = { type = "aws_sigv4", service = "s3", region = "us-east-1" }
"#,
        credentials: vec!["compatible", "unknown"],
        policies: Some(vec![("deny_bucket.rego", DENY_BUCKET.to_string())]),
        ..Extra::default()
    })
    .await
    else {
        return;
    };
    let endpoint = format!("https://s3.example-compatible.test:{}", s.s3_port);
    let results = s
        .boto3_addressing(
            "compatible",
            &endpoint,
            "virtual",
            &["delete:bucket/keep/v.txt", "delete:other/keep/v.txt"],
        )
        .await;
    assert_eq!(results[0]["ok"], false, "{}", results[0]);
    assert_eq!(results[0]["status"], 403, "{}", results[0]);
    let log = s.s3_log();
    assert!(
        !log.iter().any(|r| r["headers"]["host"]
            .as_str()
            .unwrap()
            .starts_with("bucket.")),
        "the refused delete reached the origin: {log:?}"
    );
    // Another bucket is not refused: the delete went out, re-signed for its own host.
    let forwarded: Vec<&serde_json::Value> = log
        .iter()
        .filter(|r| {
            r["method"] == "DELETE"
                && r["headers"]["host"]
                    .as_str()
                    .unwrap()
                    .starts_with("other.s3.example-compatible.test")
        })
        .collect();
    assert_eq!(forwarded.len(), 1, "{log:?}");
    assert_eq!(forwarded[0]["verified"], true, "{}", forwarded[0]);
    assert_eq!(forwarded[0]["path"], "/keep/v.txt");

    // No endpoint: `bucket.s3.unknown-compatible.test` might be bucket `bucket` or a path-style
    // endpoint; the request is refused, and never forwarded.
    let unknown = format!("https://s3.unknown-compatible.test:{}", s.s3_port);
    let results = s
        .boto3_addressing(
            "unknown",
            &unknown,
            "virtual",
            &["delete:bucket/keep/v.txt"],
        )
        .await;
    assert_eq!(results[0]["status"], 403, "{}", results[0]);
    assert_eq!(s.s3_log().len(), log.len(), "nothing more was forwarded");

    let denied: Vec<serde_json::Value> =
        s.gw.decisions(3)
            .await
            .into_iter()
            .filter(|r| r["code"] == "credential_denied")
            .collect();
    assert_eq!(denied.len(), 2, "{denied:?}");
    let reasons = denied[0]["reasons"].to_string();
    assert!(
        reasons.contains("DeleteObject in bucket bucket (key keep/v.txt)"),
        "{reasons}"
    );
    let reasons = denied[1]["reasons"].to_string();
    assert!(
        reasons.contains("cannot tell which S3 bucket") && reasons.contains("apply.endpoint"),
        "{reasons}"
    );
    s.assert_no_secret_leaked().await;
}

/// S3 answers a request it cannot authenticate with an error document naming the access key
/// id it was signed with (`<AWSAccessKeyId>`): the real one, after the proxy re-signed it.
/// The origin here knows the id but holds another secret, so every signature fails that way,
/// and it also echoes the id in a header. boto3 in the sandbox sees the error, never the id.
#[tokio::test]
async fn an_access_key_id_the_origin_echoes_is_scrubbed() {
    let Some(s) = setup_with(Extra {
        names: vec!["echo.s3.test"],
        credentials_toml: r#"
[[credentials]]
workspace = "ws-a"
name = "echo"
secret_file = {keys}
scrub_response_body = true
destinations = [{ host = "echo.s3.test", ports = [{port}] }]
apply = { type = "aws_sigv4", service = "s3", region = "us-east-1", endpoint = "echo.s3.test" }
"#,
        credentials: vec!["echo"],
        origin_args: vec![
            "--secret-key",
            "not-the-real-secret-key",
            "--echo-key-id-header",
            "x-echo-access-key-id",
        ],
        ..Extra::default()
    })
    .await
    else {
        return;
    };
    let endpoint = format!("https://echo.s3.test:{}", s.s3_port);
    let results = s
        .boto3("echo", &endpoint, &["get:bkt/k.txt", "get:bkt/missing.txt"])
        .await;
    let log = s.s3_log();
    assert_eq!(log.len(), 2, "{log:?}");
    for record in &log {
        // The origin got (and so echoed) the real id.
        let auth = record["headers"]["authorization"].as_str().unwrap();
        assert!(
            auth.contains(&format!("Credential={ACCESS_KEY}/")),
            "{auth}"
        );
        assert_eq!(record["error"], "SignatureDoesNotMatch", "{record}");
    }
    for result in &results {
        assert_eq!(result["status"], 403, "{result}");
        assert_eq!(result["code"], "SignatureDoesNotMatch", "{result}");
        // What boto3 parsed of the error document and the response headers.
        assert!(
            result["error"]["AWSAccessKeyId"]
                .as_str()
                .is_some_and(|id| id.contains("[redacted by sandgate]")),
            "{result}"
        );
        assert!(result["headers"].is_object(), "{result}");
        assert!(
            !result.to_string().contains(ACCESS_KEY),
            "the access key id reached the sandbox: {result}"
        );
    }
    s.assert_no_secret_leaked().await;
}
