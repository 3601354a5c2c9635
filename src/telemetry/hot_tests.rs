use super::{counter, histogram1, MAX_HANDLES};
use crate::telemetry::MetricsScope;

/// The value of the series `series` (name and labels, as Prometheus text writes them).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

const NAME: &str = "sandgate_hot_test_total";

fn count(phase: &'static str, decision: &'static str) {
    counter(NAME, [("phase", phase), ("decision", decision)]).increment(1);
}

#[test]
fn cached_handles_record_into_the_scope_the_thread_is_in_now() {
    let (a, b) = (MetricsScope::new(), MetricsScope::new());
    // One pooled thread running first one gateway's work, then the other's, then the first
    // again: each increment lands in the scope it was made in, with its own labels.
    MetricsScope::run_in(Some(a), || {
        count("request", "allow");
        count("request", "allow");
        count("request", "deny");
        histogram1("sandgate_hot_test_seconds", ("layer", "egress")).record(0.5);
    });
    MetricsScope::run_in(Some(b), || count("request", "allow"));
    MetricsScope::run_in(Some(a), || count("connect", "allow"));
    let allow = r#"sandgate_hot_test_total{phase="request",decision="allow"}"#;
    let (a, b) = (a.render(), b.render());
    assert_eq!(value(&a, allow), Some(2.0), "{a}");
    assert_eq!(
        value(
            &a,
            r#"sandgate_hot_test_total{phase="request",decision="deny"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &a,
            r#"sandgate_hot_test_total{phase="connect",decision="allow"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&a, r#"sandgate_hot_test_seconds_count{layer="egress"}"#),
        Some(1.0),
        "{a}"
    );
    assert_eq!(value(&b, allow), Some(1.0), "{b}");
    assert_eq!(
        value(
            &b,
            r#"sandgate_hot_test_total{phase="request",decision="deny"}"#
        ),
        None
    );
}

#[test]
fn label_sets_past_the_cache_still_record() {
    let scope = MetricsScope::new();
    let values: Vec<&'static str> = (0..MAX_HANDLES + 8)
        .map(|i| &*Box::leak(format!("v{i}").into_boxed_str()))
        .collect();
    MetricsScope::run_in(Some(scope), || {
        for _ in 0..2 {
            for v in &values {
                count(v, "allow");
            }
        }
    });
    let text = scope.render();
    for v in &values {
        let series = format!(r#"sandgate_hot_test_total{{phase="{v}",decision="allow"}}"#);
        assert_eq!(value(&text, &series), Some(2.0), "{series}");
    }
}
