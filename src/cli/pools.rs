//! `sandgate pools`: `GET /v1/pools` of a running gateway, by the output contract of
//! [`super::output`]: a table (a header row, one row per pool, then the stats window the
//! measurements cover), `-o json|yaml` for the API's answer as it is (`--json` is kept as
//! `-o json`), `-q` for the pool names.

use serde_json::Value;

use super::output::{self, Format, OutputArgs};
use super::term::{aligned, clean};
use super::{run_client, GatewayArgs};

const HEADER: [&str; 11] = [
    "POOL",
    "PROVIDER",
    "ACCOUNT",
    "LOCATION",
    "ISOLATION",
    "EGRESS",
    "CAPACITY",
    "LATENCY",
    "SUCCESS",
    "FAILURES",
    "ACCOUNT CHECK",
];

/// `sandgate pools`; `json` is the older `--json` flag.
pub fn pools(gateway: &GatewayArgs, out: &OutputArgs, json: bool) -> i32 {
    let mut out = out.clone();
    if json {
        out.output = Some(Format::Json);
    }
    let shown = out.clone();
    run_client(gateway, &shown, |api| async move {
        let url = format!("{}/v1/pools", api.base);
        let (status, body) = api.send(api.http.get(&url), &url).await?;
        if !(200..300).contains(&status) {
            eprint!("{}", output::api_error(out.output, status, &body));
            return Ok(output::exit_code(status));
        }
        let text = match out.format() {
            _ if out.quiet => names(&body),
            Format::Table | Format::Wide => table(&body),
            _ => output::render(out.format(), false, &body, &super::shapes::DOCUMENT),
        };
        print!("{text}");
        Ok(output::OK)
    })
}

/// `-q`: one pool name a line.
fn names(view: &Value) -> String {
    output::list_of(view, "pools")
        .into_iter()
        .map(|p| format!("{}\n", text(&p["pool"])))
        .collect()
}

/// The human table of a `GET /v1/pools` answer. Tolerates missing fields (an older or newer
/// gateway): an absent value shows as `-`.
fn table(view: &Value) -> String {
    let mut rows = vec![HEADER.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    let pools = view["pools"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    rows.extend(pools.iter().map(row));
    let mut out = aligned(&rows);
    if let Some(secs) = view["window_secs"].as_u64() {
        out.push_str(&format!(
            "latency, success and failures: the last {secs} s\n"
        ));
    }
    out
}

fn row(p: &Value) -> Vec<String> {
    let mut pool = text(&p["pool"]);
    if p["standby"] == Value::Bool(true) {
        pool.push_str(" (standby)");
    }
    vec![
        pool,
        provider(p),
        text(&p["account"]),
        location(p),
        isolation(&p["isolation"]),
        text(&p["egress"]),
        capacity(p),
        latency(&p["startup_latency_ms"]),
        success(&p["creation_success"]),
        failures(&p["recent_failures"]),
        account_check(&p["account_check"]),
    ]
}

/// A string value as a cell: `-` when absent; control characters (which would move the
/// terminal's cursor) are shown escaped.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) if !s.is_empty() => clean(s),
        Value::Null | Value::String(_) => "-".into(),
        other => clean(&other.to_string()),
    }
}

fn provider(p: &Value) -> String {
    let (name, kind) = (text(&p["provider"]), text(&p["provider_kind"]));
    if name == kind {
        name
    } else {
        format!("{name} ({kind})")
    }
}

fn location(p: &Value) -> String {
    let parts: Vec<String> = ["geography", "region", "zone"]
        .iter()
        .filter_map(|k| p[*k].as_str().filter(|s| !s.is_empty()).map(clean))
        .collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join("/")
    }
}

/// `microvm,container(gvisor=true)`: each mode's kind, with its other properties.
fn isolation(v: &Value) -> String {
    let modes = v.as_array().map(Vec::as_slice).unwrap_or(&[]);
    if modes.is_empty() {
        return "-".into();
    }
    modes
        .iter()
        .map(|mode| {
            let Some(props) = mode.as_object() else {
                return text(mode);
            };
            let kind = props.get("kind").map(text).unwrap_or_else(|| "-".into());
            let rest: Vec<String> = props
                .iter()
                .filter(|(k, _)| k.as_str() != "kind")
                .map(|(k, v)| format!("{}={}", clean(k), text(v)))
                .collect();
            if rest.is_empty() {
                kind
            } else {
                format!("{kind}({})", rest.join(","))
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `2/3 free` with a configured capacity, else how many live there (`1 live, no limit`).
fn capacity(p: &Value) -> String {
    match (p["free_capacity"].as_u64(), p["capacity"].as_u64()) {
        (Some(free), Some(capacity)) => format!("{free}/{capacity} free"),
        _ => format!("{} live, no limit", p["live"].as_u64().unwrap_or(0)),
    }
}

/// `412 ms (n=5)`.
fn latency(v: &Value) -> String {
    let samples = v["samples"].as_u64().unwrap_or(0);
    match v["median"].as_f64() {
        Some(ms) => format!("{ms:.0} ms (n={samples})"),
        None => format!("- (n={samples})"),
    }
}

/// `75% (3/4)`.
fn success(v: &Value) -> String {
    let (ok, all) = (
        v["successes"].as_u64().unwrap_or(0),
        v["attempts"].as_u64().unwrap_or(0),
    );
    match v["share"].as_f64() {
        Some(share) => format!("{:.0}% ({ok}/{all})", share * 100.0),
        None => "-".into(),
    }
}

/// `capacity=2,outage=1`.
fn failures(v: &Value) -> String {
    let Some(classes) = v.as_object().filter(|m| !m.is_empty()) else {
        return "-".into();
    };
    classes
        .iter()
        .map(|(class, n)| format!("{}={}", clean(class), text(n)))
        .collect::<Vec<_>>()
        .join(",")
}

/// `passed`, `failed: <why>`, `not checked`, `n/a`.
fn account_check(v: &Value) -> String {
    match v["status"].as_str() {
        Some("passed") => "passed".into(),
        Some("failed") => match v["message"].as_str() {
            Some(why) => format!("failed: {}", clean(why)),
            None => "failed".into(),
        },
        Some("not_checked") => "not checked".into(),
        Some("not_applicable") => "n/a".into(),
        _ => text(&v["status"]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pool() -> Value {
        json!({
            "pool": "a", "provider": "sim", "provider_kind": "simulated", "account": "acct",
            "geography": null, "region": "us-east-1", "zone": "us-east-1a",
            "isolation": [{"kind": "microvm"}, {"kind": "container", "gvisor": "true"}],
            "egress": "gateway", "standby": false, "capacity": 3, "free_capacity": 2, "live": 1,
            "startup_latency_ms": {"median": 412.4, "samples": 5},
            "creation_success": {"share": 0.75, "attempts": 4, "successes": 3},
            "recent_failures": {"capacity": 2, "outage": 1},
            "account_check": {"status": "failed", "checked_ms": 1, "message": "bad\u{1b}[2Jkey", "error_class": "authority"}
        })
    }

    #[test]
    fn a_row_shows_every_figure() {
        assert_eq!(
            row(&pool()),
            [
                "a",
                "sim (simulated)",
                "acct",
                "us-east-1/us-east-1a",
                "microvm,container(gvisor=true)",
                "gateway",
                "2/3 free",
                "412 ms (n=5)",
                "75% (3/4)",
                "capacity=2,outage=1",
                "failed: bad\\u{1b}[2Jkey",
            ]
        );
    }

    #[test]
    fn missing_fields_show_as_dashes_without_panicking() {
        let r = row(&json!({"pool": "b"}));
        assert_eq!(r[0], "b");
        assert_eq!(r[1], "-");
        assert_eq!(r[6], "0 live, no limit");
        assert_eq!(r[7], "- (n=0)");
        assert_eq!(r[8], "-");
        assert_eq!(table(&json!("not an object")).lines().count(), 1);
    }

    #[test]
    fn columns_are_aligned() {
        let out = table(&json!({"pools": [pool(), {"pool": "longer-name"}], "window_secs": 60}));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 4, "{out}");
        let at = |line: &str| {
            line.find("sim (simulated)")
                .or_else(|| line.find("PROVIDER"))
        };
        // The widest pool cell is "longer-name": the second column starts 2 after it.
        assert_eq!(at(lines[0]), Some("longer-name".len() + 2));
        assert_eq!(at(lines[1]), at(lines[0]));
        assert_eq!(&lines[2][13..14], "-");
        assert!(lines[3].contains("60 s"));
    }
}
