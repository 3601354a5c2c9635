use std::time::Duration;

use serde_json::json;

use super::*;

#[test]
fn blame_and_retry_default_from_the_kind() {
    let refused = Error::refused("egress_denied", "no", vec!["rule".into()]);
    assert_eq!((refused.blame, refused.retry), (Blame::Caller, Retry::No));
    let upstream = Error::new(Kind::UpstreamTimeout, "upstream_timeout", "slow");
    assert_eq!(upstream.blame, Blame::Upstream);
    assert!(upstream.retry.can_help());
    let internal = Error::internal();
    assert_eq!(
        (internal.blame, internal.retry),
        (Blame::Sandgate, Retry::No)
    );
    let store = Error::store_unavailable();
    assert_eq!(store.retry, Retry::After(Duration::from_secs(1)));
    assert_eq!(store.code, STORE_UNAVAILABLE);
}

#[test]
fn details_show_only_the_fields_that_are_set_under_their_own_names() {
    let e = Error::new(Kind::Refused, "credential_denied", "no").with_details(Details {
        credential: Some("gh".into()),
        credential_type: Some("bearer".into()),
        layer: Some(Layer::Credential),
        ..Details::destination("api.github.com", 443).with_reasons(vec!["r".into()])
    });
    let shown = serde_json::to_value(e.record()).unwrap();
    assert_eq!(
        shown,
        json!({"code": "credential_denied", "message": "no", "details": {
            "credential": "gh", "type": "bearer", "layer": "credential",
            "host": "api.github.com", "port": 443, "reasons": ["r"],
        }})
    );
    assert_eq!(Error::not_found("x").record().details, Details::default());
    assert_eq!(serde_json::to_value(Details::default()).unwrap(), json!({}));
}

#[test]
fn a_stored_record_reads_back_as_it_was_written() {
    let e = Error::new(Kind::Unavailable, "creation_failed", "none placed").with_details(Details {
        attempts: Some(Attempts::Summary(vec![AttemptSummary {
            pool: "p".into(),
            provider: "e2b".into(),
            account: "a".into(),
            error_class: None,
        }])),
        ..Details::default()
    });
    let stored = e.record().to_stored();
    assert_eq!(Record::from_stored(&stored), Some(e.record()));
    assert_eq!(Record::from_stored("{\"not\": 1}"), None);
    assert_eq!(Record::from_stored("not json"), None);
}

#[test]
fn attempts_read_back_in_the_shape_they_were_written() {
    let ruled = json!([{"provider": "x", "pool": "p", "unmet_requirements": ["gpu"]}]);
    let ruled: Attempts = serde_json::from_value(ruled).unwrap();
    assert_eq!(ruled.why_each(), vec![("p".to_string(), "gpu".to_string())]);
    let recorded = json!([{
        "id": "a1", "seq": 1, "pool": "p", "provider": "x", "account": "acc",
        "state": "ended", "outcome": "failed", "error_class": "capacity", "message": "full",
        "instance_id": null, "started_ms": 1, "finished_ms": 3, "duration_ms": 2,
        "retries": [{"at_ms": 2, "error_class": "rate_limited", "message": "slow", "wait_ms": 5}],
    }]);
    let recorded: Attempts = serde_json::from_value(recorded).unwrap();
    assert!(matches!(recorded, Attempts::Recorded(_)));
    assert_eq!(
        recorded.why_each(),
        vec![("p".to_string(), "full".to_string())]
    );
    let summary = json!([{"pool": "p", "provider": "x", "account": "a", "error_class": null}]);
    let summary: Attempts = serde_json::from_value(summary).unwrap();
    assert!(matches!(summary, Attempts::Summary(_)));
}

#[test]
fn reasons_fall_back_to_the_message() {
    let e = Error::new(Kind::Upstream, "upstream_failed", "connection reset");
    assert_eq!(e.reasons_or_message(), vec!["connection reset"]);
    let e = e.reasons(vec!["a".into(), "b".into()]);
    assert_eq!(e.reasons_or_message(), vec!["a", "b"]);
}
