use std::collections::BTreeSet;
use std::path::Path;

use super::{family, markdown, register, Kind, FAMILIES};
use crate::telemetry::MetricsScope;

/// Every metric name recorded in `src/` (a `counter!`/`gauge!`/`histogram!` macro or an
/// `ActiveGauge::new` whose first argument is a literal), with the file it is in.
fn names_in_sources() -> BTreeSet<(String, String)> {
    let pattern = regex::Regex::new(
        r#"(?:counter!|gauge!|histogram!|ActiveGauge::new|hot::counter|hot::histogram1)\(\s*"(sandgate_[a-z0-9_]+)""#,
    )
    .unwrap();
    let mut found = BTreeSet::new();
    let mut stack = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for capture in pattern.captures_iter(&text) {
                    found.insert((capture[1].to_string(), path.display().to_string()));
                }
            }
        }
    }
    found
}

#[test]
fn every_metric_recorded_in_the_code_is_in_the_catalog() {
    let found = names_in_sources();
    // The scan sees the sources: a broken pattern would pass vacuously.
    assert!(found.len() > 30, "found only {found:?}");
    let missing: Vec<_> = found
        .iter()
        .filter(|(name, _)| family(name).is_none() && !name.starts_with("sandgate_scope_test"))
        .collect();
    assert!(
        missing.is_empty(),
        "metrics recorded in src/ but not in src/telemetry/catalog.rs: {missing:?}"
    );
}

#[test]
fn rows_are_well_formed() {
    let mut names = BTreeSet::new();
    for f in FAMILIES {
        assert!(names.insert(f.name), "{} twice", f.name);
        assert_eq!(
            f.labels.len(),
            f.known.len(),
            "{}: one known list per label",
            f.name
        );
        assert!(!f.help.is_empty() && !f.help.contains('\n'), "{}", f.name);
        assert_eq!(f.kind == Kind::Histogram, f.buckets.is_some(), "{}", f.name);
        if f.kind == Kind::Counter {
            assert!(
                f.name.ends_with("_total"),
                "{}: a counter ends in _total",
                f.name
            );
        }
        if f.name.ends_with("_seconds") {
            assert_eq!(
                f.kind,
                Kind::Histogram,
                "{}: latencies are histograms",
                f.name
            );
        }
        for label in f.labels {
            assert!(
                !["sandbox", "host", "path", "ip", "request_id"].contains(label),
                "{}: `{label}` is unbounded",
                f.name
            );
        }
    }
}

#[test]
fn registered_catalog_renders_help_type_and_zero_series() {
    let scope = MetricsScope::new();
    let text = MetricsScope::run_in(Some(scope), || {
        register();
        scope.render()
    });
    // A family whose label values are all known up front renders from start; one with an
    // open label (pool, workspace...) renders with its first event.
    for f in FAMILIES
        .iter()
        .filter(|f| f.known.iter().all(|k| !k.is_empty()))
    {
        let help = format!("# HELP {} {}", f.name, f.help);
        let kind = format!("# TYPE {} {}", f.name, f.kind.as_str());
        assert!(text.contains(&help), "no `{help}` in\n{text}");
        assert!(text.contains(&kind), "no `{kind}`");
    }
    assert!(text.contains("sandgate_policy_decisions_total{layer=\"creation\",outcome=\"deny\"} 0"));
    assert!(text.contains("sandgate_policy_eval_seconds_bucket{layer=\"action\",le=\"0.00001\"} 0"));
    assert!(!text.contains("quantile="), "no summaries: {text}");
}

#[test]
fn docs_metrics_md_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md");
    let want = markdown();
    if std::env::var_os("SANDGATE_WRITE_DOCS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/metrics.md is not the catalog's; run SANDGATE_WRITE_DOCS=1 cargo test --lib telemetry::catalog"
    );
}
