//! The failure table, the lock-down entry, the options and tokens, the retry policy and the
//! schema subset.

use prost::Message;

use super::*;

fn failure(code: Option<Code>, retry_after: Option<Duration>) -> GrpcFailure {
    GrpcFailure {
        code,
        message: "x".into(),
        retry_after,
        sent: code.is_some(),
    }
}

#[test]
fn the_failure_table() {
    let cases = [
        (Code::InvalidArgument, ErrorClass::InvalidRequest),
        (Code::OutOfRange, ErrorClass::InvalidRequest),
        (Code::FailedPrecondition, ErrorClass::InvalidRequest),
        (Code::Unauthenticated, ErrorClass::UnboundAccount),
        (Code::PermissionDenied, ErrorClass::UnboundAccount),
        (Code::NotFound, ErrorClass::Unsupported),
        (Code::Unimplemented, ErrorClass::Unsupported),
        (Code::Unavailable, ErrorClass::Outage),
        (Code::DeadlineExceeded, ErrorClass::Unknown),
        (Code::Cancelled, ErrorClass::Unknown),
        (Code::ResourceExhausted, ErrorClass::Capacity),
        (Code::Internal, ErrorClass::ProviderError),
        (Code::Unknown, ErrorClass::Unknown),
        (Code::Aborted, ErrorClass::ProviderError),
        (Code::AlreadyExists, ErrorClass::ProviderError),
    ];
    for (code, class) in cases {
        assert_eq!(classify(&failure(Some(code), None)), class, "{code:?}");
    }
    let throttled = failure(Some(Code::ResourceExhausted), Some(Duration::from_secs(2)));
    assert_eq!(classify(&throttled), ErrorClass::RateLimit);
    assert_eq!(
        provider_error(throttled).retry_after,
        Some(Duration::from_secs(2))
    );
    assert_eq!(classify(&failure(None, None)), ErrorClass::Outage);
    // A refusal proves nothing was made; a server failure after the send does not.
    assert!(!create_error(failure(Some(Code::ResourceExhausted), None)).maybe_created);
    assert!(!create_error(failure(Some(Code::NotFound), None)).maybe_created);
    assert!(!create_error(failure(None, None)).maybe_created);
    assert!(create_error(failure(Some(Code::Unavailable), None)).maybe_created);
    assert!(create_error(failure(Some(Code::DeadlineExceeded), None)).maybe_created);
    assert!(create_error(failure(Some(Code::Internal), None)).maybe_created);
    assert_eq!(
        op_error(failure(Some(Code::NotFound), None)).kind,
        OpErrorKind::NotFound
    );
    assert_eq!(
        op_error(failure(Some(Code::FailedPrecondition), None)).kind,
        OpErrorKind::Conflict
    );
    assert_eq!(
        op_error(failure(Some(Code::Internal), None)).kind,
        OpErrorKind::Provider
    );
}

#[test]
fn the_retry_policy_is_read_from_the_status_details() {
    let policy = proto::RpcRetryPolicy {
        retry_after_secs: 2.5,
    };
    let status = proto::RpcStatus {
        code: Code::ResourceExhausted as i32,
        message: "slow down".into(),
        details: vec![
            proto::Any {
                type_url: "type.googleapis.com/google.rpc.DebugInfo".into(),
                value: vec![1, 2, 3],
            },
            proto::Any {
                type_url: format!("type.modal.com/{}", proto::RETRY_POLICY_TYPE),
                value: policy.encode_to_vec(),
            },
        ],
    };
    assert_eq!(
        grpc::retry_policy(&status.encode_to_vec()),
        Some(Duration::from_millis(2500))
    );
    assert_eq!(grpc::retry_policy(&[]), None);
    assert_eq!(grpc::retry_policy(&[0xff, 0xff, 0xff]), None);
}

fn egress(host: &str, lock_down: bool) -> RemoteEgress {
    RemoteEgress {
        proxy_url: format!("http://sb:token@{host}:3128"),
        gateway_host: host.to_string(),
        gateway_port: 3128,
        ca_pem: String::new(),
        lock_down,
    }
}

#[test]
fn the_gateway_is_the_only_allowed_destination() {
    let v4 = network_access(Some(&egress("203.0.113.7", true)));
    assert_eq!(
        v4.network_access_type,
        proto::NetworkAccessType::Allowlist as i32
    );
    assert_eq!(v4.allowed_cidrs, ["203.0.113.7/32"]);
    assert!(v4.allowed_domains.is_empty());
    let v6 = network_access(Some(&egress("[2001:db8::1]", true)));
    assert_eq!(v6.allowed_cidrs, ["2001:db8::1/128"]);
    let named = network_access(Some(&egress("gw.example", true)));
    assert_eq!(named.allowed_domains, ["gw.example"]);
    assert!(named.allowed_cidrs.is_empty());
    let open = network_access(Some(&egress("203.0.113.7", false)));
    assert_eq!(
        open.network_access_type,
        proto::NetworkAccessType::Open as i32
    );
    assert_eq!(
        network_access(None).network_access_type,
        proto::NetworkAccessType::Open as i32
    );
    let shown = lockdown(&egress("203.0.113.7", true)).unwrap();
    assert_eq!(shown["network_access"]["network_access_type"], "ALLOWLIST");
    assert_eq!(
        shown["network_access"]["allowed_cidrs"][0],
        "203.0.113.7/32"
    );
    assert!(lockdown(&egress("203.0.113.7", false)).is_none());
}

fn options(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn options_and_tokens() {
    let a = ModalAccount::from_options(None, &options(&[]), Secret::new("ak-1:as-2")).unwrap();
    assert_eq!(
        (a.token_id.as_str(), a.token_secret.expose()),
        ("ak-1", "as-2")
    );
    assert_eq!(a.base_url, "https://api.modal.com");
    assert_eq!(a.app_name, "sandgate");
    assert_eq!(u64::from(a.timeout_secs), MAX_TIMEOUT_SECS);
    let b = ModalAccount::from_options(
        Some("http://127.0.0.1:9/"),
        &options(&[
            ("token_id", "ak-9"),
            ("image_id", "im-x"),
            ("cpu", "0.5"),
            ("memory_mb", "512"),
        ]),
        Secret::new("as-secret"),
    )
    .unwrap();
    assert_eq!(
        (b.token_id.as_str(), b.token_secret.expose()),
        ("ak-9", "as-secret")
    );
    assert_eq!(b.base_url, "http://127.0.0.1:9");
    assert_eq!(
        (b.cpu, b.memory_mb, b.image_id.as_deref()),
        (Some(0.5), Some(512), Some("im-x"))
    );
    let bad = |opts: &[(&str, &str)], key: &str| {
        ModalAccount::from_options(None, &options(opts), Secret::new(key)).unwrap_err()
    };
    let (field, message) = bad(&[], "no-colon-secret");
    assert_eq!(field, "options.token_id");
    assert!(
        !message.contains("no-colon-secret"),
        "the key never shows: {message}"
    );
    assert_eq!(
        bad(&[("image_id", "python:3.12")], "a:b").0,
        "options.image_id"
    );
    assert_eq!(
        bad(&[("timeout_secs", "90000")], "a:b").0,
        "options.timeout_secs"
    );
    assert_eq!(bad(&[("cpu", "-1")], "a:b").0, "options.cpu");
    assert_eq!(bad(&[("colour", "red")], "a:b").0, "options.colour");
}

#[test]
fn the_schema_subset_keeps_the_published_field_numbers() {
    // The bytes the SDK's own protobuf runtime writes for the same message (checked with
    // modal 1.6.4's api_pb2). SandboxCreateRequest{app_id=1, definition=2{image_id=3, timeout_secs=7,
    // network_access=22{type=1, allowed_cidrs=2}}, tags=4{tag_name=1, tag_value=2}}.
    let request = proto::SandboxCreateRequest {
        app_id: "ap".into(),
        definition: Some(proto::Sandbox {
            image_id: "im".into(),
            timeout_secs: 5,
            network_access: Some(proto::NetworkAccess {
                network_access_type: proto::NetworkAccessType::Allowlist as i32,
                allowed_cidrs: vec!["c".into()],
                allowed_domains: vec![],
            }),
            ..Default::default()
        }),
        environment_name: String::new(),
        tags: vec![proto::SandboxTag {
            tag_name: "k".into(),
            tag_value: "v".into(),
        }],
    };
    let bytes = request.encode_to_vec();
    let expected: Vec<u8> = [
        &[0x0a, 2][..],
        b"ap",
        &[0x12, 14, 0x1a, 2],
        b"im",
        &[0x38, 5, 0xb2, 0x01, 5, 0x08, 3, 0x12, 1],
        b"c",
        &[0x22, 6, 0x0a, 1],
        b"k",
        &[0x12, 1],
        b"v",
    ]
    .concat();
    assert_eq!(bytes, expected);
    assert_eq!(
        proto::SandboxCreateRequest::decode(bytes.as_slice()).unwrap(),
        request
    );
    let wait = proto::TaskExecWaitResponse {
        exit_status: Some(proto::ExitStatus::Signal(9)),
    };
    assert_eq!(wait.encode_to_vec(), [0x10, 9]);
}
