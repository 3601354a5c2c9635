//! The fake Modal (`tests/it/common/fakes/modal.rs`) proven with the official `modal` Python
//! SDK: `tests/sdk/modal_contract.py` drives the SDK's own gRPC client (grpclib, h2c) at the
//! fake through its V1 sandbox calls (the ones sandgate's adapter speaks), and this test checks
//! what the fake recorded against what the SDK reported. Without the SDK it FAILS, never skips.
//! Then the fake's gRPC edges, called raw with tonic: auth, unknown methods, router tokens.

use crate::common;

use std::path::Path;
use std::time::Duration;

use crate::common::fakes::modal::{CreateOutcome, FakeModal, FakeModalConfig, BASE_IMAGE};
use http::uri::PathAndQuery;
use sandgate::providers::hosted::modal::proto;
use serde_json::Value;
use tonic::metadata::AsciiMetadataValue;
use tonic::Code;

/// The SDK version the fake was proven against (pinned in `tests/sdk/requirements.txt`).
const MODAL_SDK_VERSION: &str = "1.6.4";

async fn run_contract(fake: &FakeModal) -> Value {
    let python = common::sdk::python();
    if let Some(reason) = common::sdk::missing(&python, "modal") {
        // Never skipped: without the SDK the fake proves nothing.
        panic!(
            "the Modal contract test needs the official SDK ({reason}): pip install \
             modal=={MODAL_SDK_VERSION} into /opt/sandgate-sdk-venv (.ci/run does), or set \
             SANDGATE_SDK_PYTHON"
        );
    }
    let home = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/modal_contract.py");
    let mut command = tokio::process::Command::new(&python);
    command
        .arg(&script)
        .env("MODAL_SERVER_URL", fake.url())
        .env("MODAL_TOKEN_ID", fake.token_id())
        .env("MODAL_TOKEN_SECRET", fake.token_secret())
        .env("MODAL_SDK_EXPECTED_VERSION", MODAL_SDK_VERSION)
        // No ~/.modal.toml of the machine's user, no proxy between the SDK and the fake.
        .env("HOME", home.path())
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("MODAL_PROFILE")
        .env_remove("MODAL_ENVIRONMENT")
        .kill_on_drop(true);
    for proxy in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        command.env_remove(proxy);
    }
    let out = tokio::time::timeout(Duration::from_secs(180), command.output())
        .await
        .expect("the contract script finishes within 180 s")
        .expect("the contract script starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "contract script failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(
        last.strip_prefix("CONTRACT OK ")
            .unwrap_or_else(|| panic!("no CONTRACT OK line:\n{stdout}\n{stderr}")),
    )
    .expect("the report is JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_python_sdk_accepts_the_fake() {
    common::init();
    let fake = FakeModal::start(FakeModalConfig::default()).await;
    // The script's first creates: throttled then retried by the SDK, then out of capacity.
    fake.script(["rate_limit", "ok", "capacity"]);
    let report = run_contract(&fake).await;
    assert_eq!(report["sdk"], MODAL_SDK_VERSION);

    // The create log: the SDK retried the throttled create by itself (same idempotency key,
    // so one sandbox), did not retry capacity, then made three more.
    use CreateOutcome::*;
    assert_eq!(
        fake.create_log(),
        [RateLimit, Ok, Capacity, Ok, Ok, Ok],
        "{report:#}"
    );
    let s = |key: &str| {
        let id = report[key].as_str().unwrap();
        fake.sandbox(id)
            .unwrap_or_else(|| panic!("{key} {id} is not at the fake"))
    };
    let throttled = s("throttled");
    assert!(
        throttled.idempotency_key.is_some(),
        "the SDK sends x-idempotency-key"
    );

    // The main sandbox: the SDK's fields as the fake read them.
    let sandbox = s("sandbox");
    assert_eq!(sandbox.app_id, report["app"].as_str().unwrap());
    assert_eq!(sandbox.image_id, BASE_IMAGE);
    assert_eq!(sandbox.entrypoint_args, ["sleep", "infinity"]);
    assert_eq!(sandbox.env["CONTRACT_ENV"], "from-create");
    assert_eq!(sandbox.network_access_type, "ALLOWLIST");
    assert_eq!(sandbox.allowed_cidrs, ["203.0.113.7/32"]);
    assert_eq!(sandbox.timeout_secs, 600);
    assert_eq!(sandbox.tags["sandgate_sandbox"], "sb-contract");
    assert_eq!(sandbox.tags["sandgate_attempt"], "a1");
    assert_eq!(sandbox.state, "terminated");
    assert_eq!(
        fake.file(&sandbox.id, "/root/contract.txt").as_deref(),
        Some(report["file_content"].as_str().unwrap().as_bytes())
    );
    assert_eq!(report["exec_stdout"], "out\nfrom-create from-exec\n");
    let blocked = s("blocked");
    assert_eq!(blocked.network_access_type, "BLOCKED");
    assert!(blocked.allowed_cidrs.is_empty());
    // The restored sandbox started from the snapshot the SDK took.
    let restored = s("restored");
    assert_eq!(
        restored.image_id,
        report["snapshot_image"].as_str().unwrap()
    );
    assert!(fake.images().contains(&restored.image_id));
    assert_eq!(
        fake.live_count(),
        0,
        "the script terminated all: {:?}",
        fake.live()
    );
    // The commands the SDK ran, argv as sent.
    let commands = fake.commands();
    assert!(
        commands.contains(&vec![
            "sh".into(),
            "-c".into(),
            "cat > /root/contract.txt".into()
        ]),
        "{commands:?}"
    );
}

/// A raw tonic channel to the fake.
async fn raw(fake: &FakeModal) -> tonic::client::Grpc<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(fake.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    tonic::client::Grpc::new(channel)
}

/// One unary call with `headers`.
async fn call<Q, R>(
    grpc: &mut tonic::client::Grpc<tonic::transport::Channel>,
    path: &'static str,
    request: Q,
    headers: &[(&'static str, String)],
) -> Result<R, tonic::Status>
where
    Q: prost::Message + Send + Sync + 'static,
    R: prost::Message + Default + Send + Sync + 'static,
{
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new(request);
    for (name, value) in headers {
        let value = AsciiMetadataValue::try_from(value.as_str()).unwrap();
        request.metadata_mut().insert(*name, value);
    }
    let codec = tonic_prost::ProstCodec::<Q, R>::default();
    grpc.unary(request, PathAndQuery::from_static(path), codec)
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fakes_grpc_edges_answer_as_modal_does() {
    common::init();
    let fake = FakeModal::start(FakeModalConfig {
        boot_delay: Duration::ZERO,
        ..FakeModalConfig::default()
    })
    .await;
    let mut grpc = raw(&fake).await;
    let tokens = vec![
        ("x-modal-token-id", fake.token_id().to_string()),
        ("x-modal-token-secret", fake.token_secret().to_string()),
    ];
    // No token, a wrong secret: UNAUTHENTICATED, the secret never echoed.
    let app = proto::AppGetOrCreateRequest {
        app_name: "edges".into(),
        environment_name: String::new(),
        object_creation_type: proto::ObjectCreationType::CreateIfMissing as i32,
    };
    let e = call::<_, proto::AppGetOrCreateResponse>(
        &mut grpc,
        proto::client::APP_GET_OR_CREATE,
        app.clone(),
        &[],
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let wrong = vec![
        tokens[0].clone(),
        ("x-modal-token-secret", "as-wrong".into()),
    ];
    let e = call::<_, proto::AppGetOrCreateResponse>(
        &mut grpc,
        proto::client::APP_GET_OR_CREATE,
        app.clone(),
        &wrong,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(!e.message().contains("as-wrong"));
    // A lookup without CREATE_IF_MISSING of an app that does not exist: NOT_FOUND.
    let lookup = proto::AppGetOrCreateRequest {
        object_creation_type: 0,
        ..app.clone()
    };
    let e = call::<_, proto::AppGetOrCreateResponse>(
        &mut grpc,
        proto::client::APP_GET_OR_CREATE,
        lookup,
        &tokens,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let app_id = call::<_, proto::AppGetOrCreateResponse>(
        &mut grpc,
        proto::client::APP_GET_OR_CREATE,
        app,
        &tokens,
    )
    .await
    .unwrap()
    .app_id;
    // An unknown method: UNIMPLEMENTED.
    let e = call::<_, proto::ClientHelloResponse>(
        &mut grpc,
        "/modal.client.ModalClient/NoSuchCall",
        (),
        &tokens,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);

    // A create with a bad CIDR or too long a timeout is INVALID_ARGUMENT, and nothing is made.
    let create = |cidr: &str, timeout_secs: u32| proto::SandboxCreateRequest {
        app_id: app_id.clone(),
        definition: Some(proto::Sandbox {
            entrypoint_args: vec!["sleep".into(), "infinity".into()],
            image_id: BASE_IMAGE.into(),
            timeout_secs,
            network_access: Some(proto::NetworkAccess {
                network_access_type: proto::NetworkAccessType::Allowlist as i32,
                allowed_cidrs: vec![cidr.into()],
                allowed_domains: vec![],
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    for (cidr, timeout) in [
        ("203.0.113.7", 60),
        ("203.0.113.7/33", 60),
        ("10.0.0.1/32", 86401),
    ] {
        let e = call::<_, proto::SandboxCreateResponse>(
            &mut grpc,
            proto::client::SANDBOX_CREATE,
            create(cidr, timeout),
            &tokens,
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{cidr} {timeout}: {e:?}");
    }
    assert!(fake.sandboxes().is_empty());
    assert_eq!(fake.create_log(), [CreateOutcome::Rejected; 3]);

    // Two sandboxes; a router token works for its own task only.
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let id = call::<_, proto::SandboxCreateResponse>(
            &mut grpc,
            proto::client::SANDBOX_CREATE,
            create("10.0.0.1/32", 60),
            &tokens,
        )
        .await
        .unwrap()
        .sandbox_id;
        let wait = proto::SandboxGetTaskIdRequest {
            sandbox_id: id,
            timeout: Some(10.0),
            wait_until_ready: false,
        };
        let task = call::<_, proto::SandboxGetTaskIdResponse>(
            &mut grpc,
            proto::client::SANDBOX_GET_TASK_ID,
            wait,
            &tokens,
        )
        .await
        .unwrap()
        .task_id
        .expect("a task within 10 s");
        tasks.push(task);
    }
    let access = call::<_, proto::TaskGetCommandRouterAccessResponse>(
        &mut grpc,
        proto::client::TASK_GET_COMMAND_ROUTER_ACCESS,
        proto::TaskGetCommandRouterAccessRequest {
            task_id: tasks[0].clone(),
        },
        &tokens,
    )
    .await
    .unwrap();
    assert_eq!(access.url, fake.url());
    assert_eq!(access.jwt.split('.').count(), 3, "JWT-shaped");
    let start = |task: &str| proto::TaskExecStartRequest {
        task_id: task.to_string(),
        exec_id: "e1".into(),
        command_args: vec!["true".into()],
        ..Default::default()
    };
    let bearer = vec![("authorization", format!("Bearer {}", access.jwt))];
    let e = call::<_, proto::TaskExecStartResponse>(
        &mut grpc,
        proto::router::TASK_EXEC_START,
        start(&tasks[1]),
        &bearer,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let e = call::<_, proto::TaskExecStartResponse>(
        &mut grpc,
        proto::router::TASK_EXEC_START,
        start(&tasks[0]),
        &tokens,
    )
    .await
    .unwrap_err();
    assert_eq!(
        e.code(),
        Code::Unauthenticated,
        "the control plane's tokens are not the router's"
    );
    call::<_, proto::TaskExecStartResponse>(
        &mut grpc,
        proto::router::TASK_EXEC_START,
        start(&tasks[0]),
        &bearer,
    )
    .await
    .unwrap();
    let waited = call::<_, proto::TaskExecWaitResponse>(
        &mut grpc,
        proto::router::TASK_EXEC_WAIT,
        proto::TaskExecWaitRequest {
            task_id: tasks[0].clone(),
            exec_id: "e1".into(),
        },
        &bearer,
    )
    .await
    .unwrap();
    assert_eq!(waited.exit_status, Some(proto::ExitStatus::Code(0)));
}
