//! `sandgate sandbox get --why`: a sandbox's placement record and attempts as text.
//!
//! The record is the router's explanation kept when the create was accepted (see
//! `create::record`), so this answers from what routing saw then, not from today's
//! measurements. Layout:
//!
//! ```text
//! sb-…: running on pool sim-b (provider sim, account acct-1)
//! routed at 2026-12-01T18:10:00Z on the gateway's measured context (window 3600 s, 2 existing sandboxes)
//! priorities: startup_latency   bands: startup_latency_ms=250 creation_success=0.05
//! order  pool   provider  tier  rank                     latency_ms(n)  success(n)  free  unmet
//! 1      sim-a  sim       0     startup_latency=80 [0]   80 (12)        0.50 (4)    -     -
//! -      sim-c  sim       -     -                        -              -           -     features.pty
//! attempts:
//! 1  sim-a  advance    provider_error  12 ms  simulated failure
//! ```

use std::fmt::Write as _;

use serde_json::Value;

use super::term::{aligned, clean};

/// The text for a `GET /v1/sandboxes/{id}` body.
pub fn render(sandbox: &Value) -> String {
    let mut out = String::new();
    let id = sandbox["id"].as_str().unwrap_or("?");
    let state = sandbox["state"].as_str().unwrap_or("?");
    let placement = &sandbox["placement"];
    match placement["pool"].as_str() {
        Some(pool) => {
            let _ = writeln!(
                out,
                "{id}: {state} on pool {pool} (provider {}, account {})",
                text(&placement["provider"]),
                text(&placement["account"])
            );
        }
        None => {
            let _ = writeln!(out, "{id}: {state}, not placed");
        }
    }
    let record = &sandbox["placement_record"];
    if record.is_null() {
        out.push_str("no placement record (the sandbox was created before records were kept)\n");
    } else {
        explanation(&mut out, record);
    }
    attempts(&mut out, &sandbox["attempts"]);
    out
}

fn explanation(out: &mut String, record: &Value) {
    let ctx = &record["context"];
    let at = record["recorded_ms"]
        .as_i64()
        .and_then(|ms| time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000).ok())
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| "?".into());
    let _ = writeln!(
        out,
        "routed at {at} on the {}'s measured context (window {} s, {} existing sandboxes)",
        text(&record["source"]),
        text(&ctx["stats_window_secs"]),
        text(&ctx["existing_sandboxes"])
    );
    let x = &record["explanation"];
    let priorities: Vec<String> = list(&x["priorities"]).iter().map(text).collect();
    let bands = &x["bands"];
    let _ = writeln!(
        out,
        "priorities: {}   bands: price={} startup_latency_ms={} creation_success={}",
        if priorities.is_empty() {
            "-".into()
        } else {
            priorities.join(",")
        },
        text(&bands["price"]),
        text(&bands["startup_latency_ms"]),
        text(&bands["creation_success"])
    );
    let mut rows = vec![[
        "order",
        "pool",
        "provider",
        "tier",
        "rank",
        "latency_ms(n)",
        "success(n)",
        "free",
        "unmet",
    ]
    .map(String::from)
    .to_vec()];
    let mut pools: Vec<&Value> = list(&x["pools"]).iter().collect();
    // Candidates first, in order; then the ineligible pools in configuration order.
    pools.sort_by_key(|p| p["position"].as_u64().unwrap_or(u64::MAX));
    for p in pools {
        rows.push(pool_row(p));
    }
    out.push_str(&aligned(&rows));
    let excluded = list(&record["excluded"]);
    for e in excluded {
        let _ = writeln!(out, "excluded {}: {}", text(&e["pool"]), text(&e["reason"]));
    }
}

fn pool_row(p: &Value) -> Vec<String> {
    let m = &p["metrics"];
    let rank: Vec<String> = list(&p["rank"])
        .iter()
        .map(|k| match k["band"].as_i64() {
            Some(band) => format!("{}={} [{band}]", text(&k["priority"]), text(&k["value"])),
            None => format!("{}={}", text(&k["priority"]), text(&k["value"])),
        })
        .collect();
    let unmet: Vec<String> = list(&p["unmet_requirements"]).iter().map(text).collect();
    vec![
        p["position"]
            .as_u64()
            .map_or("-".into(), |n| (n + 1).to_string()),
        text(&p["pool"]),
        text(&p["provider"]),
        text(&p["tier"]),
        dash(rank.join(" ")),
        format!(
            "{} ({})",
            text(&m["startup_latency_ms"]),
            text(&m["startup_latency_samples"])
        ),
        format!(
            "{} ({})",
            share(&m["creation_success"]),
            text(&m["attempts"])
        ),
        text(&p["free_capacity"]),
        dash(unmet.join("; ")),
    ]
}

fn attempts(out: &mut String, attempts: &Value) {
    let attempts = list(attempts);
    if attempts.is_empty() {
        out.push_str("attempts: none yet\n");
        return;
    }
    out.push_str("attempts:\n");
    let rows: Vec<Vec<String>> = attempts
        .iter()
        .map(|a| {
            vec![
                text(&a["seq"]),
                text(&a["pool"]),
                text(&a["state"]),
                text(&a["error_class"]),
                a["duration_ms"]
                    .as_i64()
                    .map_or("-".into(), |d| format!("{d} ms")),
                text(&a["message"]),
            ]
        })
        .collect();
    out.push_str(&aligned(&rows));
}

fn list(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// A JSON scalar as text; `-` for null or absent. Control characters from stored values are
/// escaped so a label cannot rewrite the terminal.
fn text(v: &Value) -> String {
    let s = match v {
        Value::Null => return "-".into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => format!("{}", (f * 1000.0).round() / 1000.0),
            _ => n.to_string(),
        },
        other => other.to_string(),
    };
    clean(&s)
}

fn share(v: &Value) -> String {
    v.as_f64().map_or("-".into(), |f| format!("{f:.2}"))
}

fn dash(s: String) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_order_unmet_and_attempts() {
        let body = json!({
            "id": "sb-1", "state": "running",
            "placement": {"pool": "b", "provider": "sim", "account": "acct"},
            "placement_record": {
                "recorded_ms": 0, "source": "gateway",
                "context": {"stats_window_secs": 60, "existing_sandboxes": 0},
                "explanation": {
                    "priorities": ["startup_latency"],
                    "bands": {"price": 0.0, "startup_latency_ms": 250.0, "creation_success": 0.05},
                    "pools": [
                        {"pool": "c", "provider": "sim", "tier": null, "position": null, "rank": [],
                         "metrics": {"startup_latency_ms": null, "startup_latency_samples": 0, "creation_success": null, "attempts": 0},
                         "unmet_requirements": ["features.pty"], "free_capacity": null},
                        {"pool": "a", "provider": "sim", "tier": 0, "position": 0,
                         "rank": [{"priority": "startup_latency", "value": 80.0, "band": 0}],
                         "metrics": {"startup_latency_ms": 80.0, "startup_latency_samples": 3, "creation_success": 0.5, "attempts": 4},
                         "unmet_requirements": [], "free_capacity": 2},
                    ]
                },
                "excluded": []
            },
            "attempts": [{"seq": 1, "pool": "a", "state": "advanced", "error_class": "provider_error", "duration_ms": 12, "message": "boom\u{1b}[2J"}]
        });
        let text = render(&body);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "sb-1: running on pool b (provider sim, account acct)"
        );
        assert!(lines[1].starts_with("routed at 1970-01-01T00:00:00Z on the gateway's"));
        let a = lines
            .iter()
            .position(|l| l.starts_with("1 ") && l.contains(" a "))
            .unwrap();
        let c = lines
            .iter()
            .position(|l| l.contains("features.pty"))
            .unwrap();
        assert!(a < c, "candidates come before ineligible pools:\n{text}");
        assert!(lines[a].contains("startup_latency=80 [0]") && lines[a].contains("0.50 (4)"));
        assert!(
            text.contains("provider_error  12 ms  boom\\u{1b}[2J"),
            "{text}"
        );
        assert!(!text.contains('\u{1b}'));
    }

    #[test]
    fn a_sandbox_without_a_record_says_so() {
        let text = render(
            &json!({"id": "sb-2", "state": "failed", "placement": null, "placement_record": null, "attempts": []}),
        );
        assert!(text.contains("sb-2: failed, not placed"));
        assert!(text.contains("no placement record"));
        assert!(text.contains("attempts: none yet"));
    }
}
