//! Replaying logged decisions: reading a decision log (JSON lines, as `[log] decisions`
//! writes it) and evaluating its recorded inputs again, under the policy that decided them
//! (does it still decide the same?) or under a candidate policy (what would flip?).
//!
//! A record is replayable when it carries the input policy evaluated and the policy's own
//! answer: every `kind: "policy"` record (`input`, `result`), and an egress record whose
//! decision policy made (`input`, `policy_result`; a refusal made before policy, such as a
//! placeholder in the host, has none and is skipped). The input is complete (the proxy's
//! derivations, `match_names` and the sandbox's `allow_domains`, `labels` and `cidrs`, are
//! in it); what a policy reads from `data` comes from the policy directory replayed against.
//! What the log removed stays removed: authenticating header values are `[redacted]` and an
//! exec's argv is summarised (`argv0`, `argc`, `argv_sha256`) unless `[log] full_argv`, so a
//! rule that reads those values may answer differently on replay.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Read};
use std::path::Path;

use super::{Layer, PolicyEngine};

/// Longest line read (a record is a few KiB): a longer one is refused by its number rather
/// than read whole into memory.
pub const MAX_LINE_BYTES: usize = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{file}: {reason}")]
    File { file: String, reason: String },
    #[error("{file}:{line}: {reason}")]
    Line {
        file: String,
        line: usize,
        reason: String,
    },
    #[error("{file}: no replayable decision {id}")]
    NotFound { file: String, id: String },
    #[error(transparent)]
    Policy(#[from] super::PolicyError),
}

/// What a layer answered, as compared on replay: deny reasons as a set, the egress action
/// only when allowed (a refused connection takes no action), and the refusals observed but
/// not enforced (`would_deny`, see [`super::audit`]) only when allowed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Answer {
    pub allow: bool,
    pub deny: BTreeSet<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(skip_serializing_if = "BTreeSet::is_empty")]
    pub would_deny: BTreeSet<String>,
}

/// The three outcomes replay tells apart: a flip is a change from one to another.
pub const ALLOW: &str = "allow";
pub const WOULD_DENY: &str = "would-deny";
pub const DENY: &str = "deny";

fn reason_set(value: Option<&serde_json::Value>) -> BTreeSet<String> {
    match value {
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .map(|r| r.as_str().map_or_else(|| r.to_string(), str::to_string))
            .collect(),
        _ => BTreeSet::new(),
    }
}

impl Answer {
    fn from_result(layer: Layer, result: &serde_json::Value) -> Option<Answer> {
        let allow = result.get("allow")?.as_bool()?;
        let deny = reason_set(result.get("deny"));
        let action = (allow && layer == Layer::Egress)
            .then(|| {
                result
                    .get("action")
                    .and_then(|a| a.as_str())
                    .map(String::from)
            })
            .flatten();
        Some(Answer {
            allow,
            deny: if allow { BTreeSet::new() } else { deny },
            action,
            would_deny: if allow {
                reason_set(result.get("would_deny"))
            } else {
                BTreeSet::new()
            },
        })
    }

    /// `allow`, `would-deny` (let through under audit) or `deny`.
    pub fn outcome(&self) -> &'static str {
        match (self.allow, self.would_deny.is_empty()) {
            (false, _) => DENY,
            (true, false) => WOULD_DENY,
            (true, true) => ALLOW,
        }
    }

    fn from_decision(layer: Layer, decision: &super::Decision) -> Answer {
        Answer {
            allow: decision.allowed,
            deny: if decision.allowed {
                BTreeSet::new()
            } else {
                decision.reasons.iter().cloned().collect()
            },
            action: (decision.allowed && layer == Layer::Egress).then(|| decision.action.clone()),
            would_deny: decision.would_deny.iter().cloned().collect(),
        }
    }
}

/// One replayable record.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// 1-based line number in the log.
    pub line: usize,
    pub decision_id: String,
    pub layer: Layer,
    pub input: serde_json::Value,
    pub recorded: Answer,
    pub generation: u64,
}

impl Recorded {
    /// The record on one log line: `Ok(None)` for a record with nothing to replay.
    fn parse(text: &[u8]) -> Result<Option<Recorded>, String> {
        let record: serde_json::Value =
            serde_json::from_slice(text).map_err(|e| format!("not a JSON record: {e}"))?;
        if !record.is_object() {
            return Err("not a JSON object".into());
        }
        let result = match record["kind"].as_str() {
            Some("policy") => &record["result"],
            Some("egress") => match record.get("policy_result") {
                Some(result) => result,
                None => return Ok(None),
            },
            _ => return Ok(None),
        };
        let layer: Layer = record["layer"]
            .as_str()
            .ok_or("the record names no layer")?
            .parse()
            .map_err(|e| format!("{e}"))?;
        let decision_id = record["decision_id"]
            .as_str()
            .ok_or("the record has no decision_id")?
            .to_string();
        let recorded = Answer::from_result(layer, result)
            .ok_or("the record's result has no boolean `allow`")?;
        let input = record
            .get("input")
            .cloned()
            .ok_or("the record has no input")?;
        Ok(Some(Recorded {
            line: 0,
            decision_id,
            layer,
            input,
            recorded,
            generation: record["labels"]["generation"].as_u64().unwrap_or(0),
        }))
    }

    /// Evaluates the recorded input under `engine`.
    pub fn evaluate(&self, engine: &PolicyEngine) -> (Answer, super::Decision) {
        let decision = engine.decide(self.layer, regorus::Value::from(self.input.clone()));
        (Answer::from_decision(self.layer, &decision), decision)
    }

    /// `input.workspace` (API layers) or `input.sandbox.workspace` (egress, credential).
    pub fn workspace(&self) -> Option<&str> {
        self.input["workspace"]
            .as_str()
            .or_else(|| self.input["sandbox"]["workspace"].as_str())
    }

    pub fn sandbox(&self) -> Option<&str> {
        self.input["sandbox"]["id"].as_str()
    }

    /// `host:port` of an egress or credential decision.
    pub fn destination(&self) -> Option<String> {
        let d = &self.input["destination"];
        Some(format!("{}:{}", d["host"].as_str()?, d["port"].as_u64()?))
    }
}

/// Reads every replayable record of a decision log, calling `each` on it; returns how many
/// lines held nothing to replay. A malformed or over-long line is an error naming it.
pub fn read(path: &Path, each: impl FnMut(Recorded) -> bool) -> Result<usize, ReplayError> {
    let file = path.display().to_string();
    let handle = std::fs::File::open(path).map_err(|e| ReplayError::File {
        file: file.clone(),
        reason: e.to_string(),
    })?;
    read_from(std::io::BufReader::new(handle), file, each)
}

/// [`read`] over any reader of JSON lines (`file` names it in errors): records fetched from
/// a gateway's `GET /v1/decisions` are replayed through this.
pub fn read_from(
    mut reader: impl BufRead,
    file: String,
    mut each: impl FnMut(Recorded) -> bool,
) -> Result<usize, ReplayError> {
    let mut buf = Vec::new();
    let (mut line, mut skipped) = (0usize, 0usize);
    loop {
        buf.clear();
        line += 1;
        let n = (&mut reader)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut buf)
            .map_err(|e| ReplayError::Line {
                file: file.clone(),
                line,
                reason: e.to_string(),
            })?;
        if n == 0 {
            return Ok(skipped);
        }
        if buf.len() > MAX_LINE_BYTES {
            return Err(ReplayError::Line {
                file,
                line,
                reason: format!("longer than {MAX_LINE_BYTES} bytes; not a decision record"),
            });
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match Recorded::parse(&buf) {
            Ok(Some(mut record)) => {
                record.line = line;
                if !each(record) {
                    return Ok(skipped);
                }
            }
            Ok(None) => skipped += 1,
            Err(reason) => return Err(ReplayError::Line { file, line, reason }),
        }
    }
}

/// The replayable record `id` of the log at `path`.
pub fn find(path: &Path, id: &str) -> Result<Recorded, ReplayError> {
    let mut found = None;
    read(path, |record| {
        if record.decision_id == id {
            found = Some(record);
            return false;
        }
        true
    })?;
    found.ok_or_else(|| ReplayError::NotFound {
        file: path.display().to_string(),
        id: id.to_string(),
    })
}

/// Examples kept per flip group.
pub const EXAMPLES: usize = 3;

/// Decisions that flip under a candidate policy, grouped by what they have in common.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct FlipKey {
    pub layer: &'static str,
    /// From the recorded outcome to the candidate's: `allow→deny`, `deny→allow`, and with
    /// audit (see [`Answer::outcome`]) `allow→would-deny`, `would-deny→deny`, ...
    pub flip: String,
    pub workspace: Option<String>,
    pub sandbox: Option<String>,
    /// `host:port`, for egress and credential decisions.
    pub destination: Option<String>,
    /// What decided the new answer: the candidate's deny reasons (and refusing scope) when
    /// it refuses, its would-deny reasons when it observes a refusal, the recorded reasons
    /// when it allows.
    pub reason: String,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct FlipGroup {
    #[serde(flatten)]
    pub key: FlipKey,
    pub count: usize,
    /// Up to [`EXAMPLES`] decision ids.
    pub examples: Vec<String>,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReplayReport {
    /// Records replayed.
    pub replayed: usize,
    /// Lines with nothing to replay (refusals made before policy).
    pub skipped: usize,
    pub flipped: usize,
    /// Same allow/deny, other reasons or action: not flips, counted for information.
    pub changed: usize,
    pub groups: Vec<FlipGroup>,
}

/// Evaluates every replayable record of `decisions` under `candidate`.
pub fn replay(decisions: &Path, candidate: &PolicyEngine) -> Result<ReplayReport, ReplayError> {
    let file = decisions.display().to_string();
    let handle = std::fs::File::open(decisions).map_err(|e| ReplayError::File {
        file: file.clone(),
        reason: e.to_string(),
    })?;
    replay_from(std::io::BufReader::new(handle), file, candidate)
}

/// [`replay`] over any reader of JSON lines (`file` names it in errors).
pub fn replay_from(
    reader: impl BufRead,
    file: String,
    candidate: &PolicyEngine,
) -> Result<ReplayReport, ReplayError> {
    let mut report = ReplayReport::default();
    let mut groups: BTreeMap<FlipKey, FlipGroup> = BTreeMap::new();
    report.skipped = read_from(reader, file, |record| {
        report.replayed += 1;
        let (answer, decision) = record.evaluate(candidate);
        if answer.outcome() == record.recorded.outcome() {
            report.changed += usize::from(answer != record.recorded);
            return true;
        }
        report.flipped += 1;
        let key = flip_key(&record, &answer, &decision);
        let group = groups.entry(key.clone()).or_insert(FlipGroup {
            key,
            count: 0,
            examples: Vec::new(),
        });
        group.count += 1;
        if group.examples.len() < EXAMPLES {
            group.examples.push(record.decision_id.clone());
        }
        true
    })?;
    report.groups = groups.into_values().collect();
    report
        .groups
        .sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
    Ok(report)
}

fn flip_key(record: &Recorded, answer: &Answer, decision: &super::Decision) -> FlipKey {
    let join = |reasons: &BTreeSet<String>| reasons.iter().cloned().collect::<Vec<_>>().join("; ");
    let reason = match answer.outcome() {
        DENY => {
            let mut reason = join(&answer.deny);
            if let Some(scope) = decision.deny_scope.as_deref() {
                reason = format!("{reason} [scope {scope}]");
            }
            reason
        }
        WOULD_DENY => join(&answer.would_deny),
        _ if record.recorded.allow => join(&record.recorded.would_deny),
        _ => join(&record.recorded.deny),
    };
    let flip = format!("{}→{}", record.recorded.outcome(), answer.outcome());
    FlipKey {
        layer: record.layer.as_str(),
        flip,
        workspace: record.workspace().map(String::from),
        sandbox: record.sandbox().map(String::from),
        destination: record.destination(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(lines: &[&[u8]]) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        for line in lines {
            std::io::Write::write_all(&mut file, line).unwrap();
            std::io::Write::write_all(&mut file, b"\n").unwrap();
        }
        file
    }

    const GOOD: &[u8] = br#"{"kind":"policy","layer":"lifecycle","decision_id":"d1","input":{"operation":"stop"},"result":{"allow":false,"deny":["no"]},"labels":{"generation":3}}"#;

    #[test]
    fn a_malformed_line_is_named_and_nothing_after_it_is_read() {
        let file = log(&[GOOD, b"{\"kind\": \"policy\", truncated", GOOD]);
        let e = read(file.path(), |_| true).unwrap_err().to_string();
        assert!(e.contains(":2: not a JSON record: "), "{e}");
        let file = log(&[GOOD, b"[1,2]"]);
        let e = read(file.path(), |_| true).unwrap_err().to_string();
        assert!(e.contains(":2: not a JSON object"), "{e}");
        let file = log(&[br#"{"kind":"policy","layer":"nope","decision_id":"x","input":{},"result":{"allow":true}}"#]);
        let e = read(file.path(), |_| true).unwrap_err().to_string();
        assert!(e.contains(":1: ") && e.contains("nope"), "{e}");
    }

    #[test]
    fn an_over_long_line_is_refused_by_number_without_reading_it_whole() {
        let huge = vec![b'x'; MAX_LINE_BYTES + 10];
        let file = log(&[GOOD, b"", &huge, GOOD]);
        let e = read(file.path(), |_| true).unwrap_err().to_string();
        assert!(e.contains(":3: longer than"), "{e}");
    }

    #[test]
    fn records_policy_did_not_decide_are_skipped_and_ids_found() {
        let egress = br#"{"kind":"egress","layer":"egress","decision_id":"e1","input":{},"result":{"allow":false}}"#;
        let file = log(&[egress, GOOD]);
        let mut seen = Vec::new();
        let skipped = read(file.path(), |r| {
            seen.push((r.line, r.decision_id, r.generation, r.recorded.allow));
            true
        })
        .unwrap();
        assert_eq!(skipped, 1);
        assert_eq!(seen, [(2, "d1".to_string(), 3, false)]);
        assert_eq!(find(file.path(), "d1").unwrap().line, 2);
        let e = find(file.path(), "e1").unwrap_err().to_string();
        assert!(e.contains("no replayable decision e1"), "{e}");
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_lines_never_panic(lines in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..200), 0..8)) {
            let lines: Vec<Vec<u8>> = lines.into_iter().map(|l| l.into_iter().filter(|b| *b != b'\n').collect()).collect();
            let refs: Vec<&[u8]> = lines.iter().map(Vec::as_slice).collect();
            let file = log(&refs);
            let _ = read(file.path(), |_| true);
        }
    }
}
