//! The failure table, the lock-down entry, the options, the labels and the protobuf subset.

use super::proto::{self, Event, Reader, Writer};
use super::*;
use crate::providers::Tags;

fn failure(status: Option<u16>, sent: bool) -> HttpFailure {
    crate::providers::hosted::errors::test_failure(status, json!({"detail": "x"}), sent)
}

#[test]
fn the_failure_table() {
    let cases = [
        (Some(400), ErrorClass::InvalidRequest),
        (Some(422), ErrorClass::InvalidRequest),
        (Some(401), ErrorClass::UnboundAccount),
        (Some(402), ErrorClass::Billing),
        (Some(403), ErrorClass::UnboundAccount),
        (Some(404), ErrorClass::Unsupported),
        (Some(409), ErrorClass::ProviderError),
        (Some(429), ErrorClass::RateLimit),
        (Some(500), ErrorClass::ProviderError),
        (Some(502), ErrorClass::Outage),
        (Some(503), ErrorClass::Outage),
        (Some(504), ErrorClass::Unknown),
    ];
    for (status, class) in cases {
        assert_eq!(classify(&failure(status, true)), class, "{status:?}");
    }
    assert_eq!(classify(&failure(None, false)), ErrorClass::Outage);
    assert_eq!(classify(&failure(None, true)), ErrorClass::Unknown);
    // FastAPI's detail is the message.
    let e = provider_error(failure(Some(429), true));
    assert!(e.message.contains("429") && e.message.contains('x'), "{e}");
}

fn egress(host: &str, url: &str, port: u16, lock_down: bool) -> RemoteEgress {
    RemoteEgress {
        proxy_url: url.to_string(),
        gateway_host: host.to_string(),
        gateway_port: port,
        ca_pem: String::new(),
        lock_down,
    }
}

#[test]
fn the_gateway_is_the_only_allowed_destination() {
    let v4 = egress("203.0.113.9", "http://sb:t@203.0.113.9:3128", 3128, true);
    assert_eq!(
        lockdown(&v4),
        Some(json!({"network_allowlist": ["203.0.113.9"]}))
    );
    let named = egress("gw.example", "https://sb:t@gw.example:443", 443, true);
    assert_eq!(
        lockdown(&named),
        Some(json!({"network_allowlist": ["gw.example"]}))
    );
    // A name on another port, or plain HTTP, is not matched by Prime's domain rules.
    for e in [
        egress("gw.example", "https://sb:t@gw.example:3128", 3128, true),
        egress("gw.example", "http://sb:t@gw.example:443", 443, true),
        egress("2001:db8::1", "http://sb:t@[2001:db8::1]:3128", 3128, true),
    ] {
        assert!(allow_entry(&e).is_err(), "{e:?}");
        assert!(lockdown(&e).is_none());
    }
    assert!(lockdown(&egress("203.0.113.9", "http://x", 3128, false)).is_none());
}

#[test]
fn options_are_checked() {
    let key = Secret::new("k".to_string());
    let options = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let a = PrimeAccount::from_options(None, &options(&[]), key.clone()).unwrap();
    assert_eq!(a.base_url, "https://api.primeintellect.ai");
    assert_eq!(a.docker_image, "python:3.11-slim");
    assert_eq!(a.timeout_minutes, 60);
    let a = PrimeAccount::from_options(
        Some("http://127.0.0.1:9/api/v1/"),
        &options(&[("cpu_cores", "0.5"), ("timeout_minutes", "30")]),
        key.clone(),
    )
    .unwrap();
    assert_eq!(a.base_url, "http://127.0.0.1:9");
    assert_eq!(a.cpu_cores, Some(0.5));
    for bad in [
        ("cpu_cores", "-1"),
        ("docker_image", " "),
        ("nope", "1"),
        ("timeout_minutes", "0"),
    ] {
        let e = PrimeAccount::from_options(None, &options(&[bad]), key.clone()).unwrap_err();
        assert_eq!(e.0, format!("options.{}", bad.0));
    }
}

#[test]
fn tags_travel_as_labels() {
    let tags = Tags {
        sandbox_id: "sb-1".into(),
        attempt_id: "sb-1-a1".into(),
    };
    let labels = wire::tag_labels(&tags);
    assert_eq!(
        labels,
        ["sandgate_sandbox=sb-1", "sandgate_attempt=sb-1-a1"]
    );
    let mut with_other = labels.clone();
    with_other.push("team=x".into());
    with_other.push("plain".into());
    let view = SandboxView {
        id: "s".into(),
        status: "PROVISIONING".into(),
        labels: with_other,
        error_type: None,
        error_message: None,
        gateway_auth: None,
        created_at: Some("2020-01-01T00:00:00Z".into()),
        timeout_minutes: Some(60),
    };
    assert_eq!(view.time_left(), Some(Duration::ZERO), "long over");
    let instance = wire::instance_of(&view);
    assert_eq!(instance.tags, tags);
    assert_eq!(instance.state, crate::providers::InstanceState::Starting);
}

#[test]
fn the_protobuf_subset_round_trips() {
    let env = BTreeMap::from([("A".to_string(), "1".to_string())]);
    let argv = ["sh", "-c", "echo hi"].map(String::from);
    let bytes = proto::start_request(&argv, &env, Some("/tmp"), "u-1");
    // Read back as the server would: CommandSpec in field 1, session_uuid in field 5.
    let mut r = Reader::new(&bytes);
    let mut seen = Vec::new();
    while let Some((field, value)) = r.next_field().unwrap() {
        if field == 1 {
            let mut spec = Reader::new(value.as_bytes());
            while let Some((f, v)) = spec.next_field().unwrap() {
                seen.push((f, v.as_str()));
            }
        } else {
            seen.push((100 + field, value.as_str()));
        }
    }
    assert_eq!(seen[0], (1, "sh".to_string()));
    assert_eq!(seen[1], (2, "-c".to_string()));
    assert_eq!(seen[2], (2, "echo hi".to_string()));
    assert_eq!(seen[3].0, 3);
    assert_eq!(seen[4], (4, "/tmp".to_string()));
    assert_eq!(seen[5], (105, "u-1".to_string()));

    // Events as the server writes them.
    let event = |inner: u32, body: Writer| {
        let mut e = Writer::new();
        e.message(inner, &body);
        let mut response = Writer::new();
        response.message(1, &e);
        response.finish()
    };
    let mut data = Writer::new();
    data.bytes(2, b"oops");
    assert_eq!(
        proto::read_event(&event(2, data)).unwrap(),
        Event::Stderr(b"oops".to_vec())
    );
    let mut end = Writer::new();
    end.sint32(1, -3).bool(2, true).string(3, "exited");
    assert_eq!(
        proto::read_event(&event(3, end)).unwrap(),
        Event::End {
            exit_code: -3,
            exited: true,
            status: "exited".into(),
            error: None
        }
    );
    let mut start = Writer::new();
    start.uint(1, 4242).uint(9, 1);
    assert_eq!(
        proto::read_event(&event(1, start)).unwrap(),
        Event::Started { pid: 4242 }
    );
    // Malformed input is an error, never a panic.
    assert!(proto::read_event(&[0x0a, 0x05, 0x01]).is_err());
    assert!(proto::read_event(&[0xff; 11]).is_err());
    assert!(proto::read_event(&[0x0b]).is_err());
}

proptest::proptest! {
    #[test]
    fn any_bytes_read_without_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..128)) {
        let _ = proto::read_event(&bytes);
    }
}
