//! `sandgate policy eval --replay ID` and `sandgate policy replay` (see
//! `policies/README.md`, "Replaying decisions"): the printing and exit codes around
//! [`crate::policy::replay`]. Exit codes: 0 the same (nothing flips), 1 differs (something
//! flips), 2 an error (unreadable log, malformed line, policy that does not load).

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::policy::replay::{self, ReplayReport};
use crate::policy::PolicyEngine;

/// The arguments of `sandgate policy replay`.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// Decision log (JSON lines, as `[log] decisions` writes it).
    #[arg(long, required_unless_present = "since", conflicts_with = "since")]
    pub decisions: Option<PathBuf>,
    /// Instead of a file, the decisions a running gateway kept in memory since then
    /// (`GET /v1/decisions?since=`: a duration such as 24h, or an RFC 3339 time).
    #[arg(long)]
    pub since: Option<String>,
    /// The gateway for `--since` (default SANDGATE_URL, else http://127.0.0.1:7070;
    /// SANDGATE_TOKEN authenticates).
    #[arg(long, requires = "since")]
    pub url: Option<String>,
    /// Candidate policy directory to evaluate every recorded input under.
    #[arg(long)]
    pub against: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `sandgate policy eval --replay ID --decisions FILE [--dir DIR]`: re-evaluates one recorded
/// input under `dir` and says whether the answer matches the recorded one.
pub fn eval_replay(
    id: &str,
    decisions: &Path,
    dir: &Path,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    let run = || -> Result<(serde_json::Value, bool), replay::ReplayError> {
        let record = replay::find(decisions, id)?;
        let engine = PolicyEngine::load(dir)?;
        let (answer, decision) = record.evaluate(&engine);
        let matches = answer == record.recorded;
        Ok((
            serde_json::json!({
                "decision_id": record.decision_id,
                "line": record.line,
                "layer": record.layer,
                "recorded": record.recorded,
                "recorded_generation": record.generation,
                "replayed": answer,
                "deny_scope": decision.deny_scope.as_deref(),
                "matches": matches,
            }),
            matches,
        ))
    };
    match run() {
        Ok((report, matches)) => {
            let text = serde_json::to_string_pretty(&report).unwrap_or_default();
            let _ = writeln!(out, "{text}");
            i32::from(!matches)
        }
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            2
        }
    }
}

/// `sandgate policy replay --decisions FILE --against DIR [--json]`.
pub fn replay_against(args: &ReplayArgs, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let report = PolicyEngine::load(&args.against)
        .map_err(replay::ReplayError::from)
        .and_then(|engine| match (&args.decisions, &args.since) {
            (Some(file), _) => replay::replay(file, &engine),
            (None, Some(since)) => {
                let lines = super::logs::fetch_lines(args.url.as_deref(), since)?;
                replay::replay_from(lines.as_slice(), "GET /v1/decisions".into(), &engine)
            }
            (None, None) => Err(replay::ReplayError::File {
                file: "-".into(),
                reason: "give --decisions FILE or --since DURATION".into(),
            }),
        });
    let report = match report {
        Ok(report) => report,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            return 2;
        }
    };
    let _ = if args.json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        )
    } else {
        write_text(&report, out)
    };
    i32::from(report.flipped > 0)
}

fn write_text(report: &ReplayReport, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{} decisions replayed, {} flipped, {} same verdict with other reasons/action, {} lines not replayable",
        report.replayed, report.flipped, report.changed, report.skipped
    )?;
    for group in &report.groups {
        let key = &group.key;
        writeln!(
            out,
            "{:>6}  {} {}  workspace={} sandbox={}{}",
            group.count,
            key.layer,
            key.flip,
            key.workspace.as_deref().unwrap_or("-"),
            key.sandbox.as_deref().unwrap_or("-"),
            key.destination
                .as_deref()
                .map(|d| format!(" destination={d}"))
                .unwrap_or_default(),
        )?;
        writeln!(out, "        reason: {}", key.reason)?;
        writeln!(out, "        e.g. {}", group.examples.join(", "))?;
    }
    Ok(())
}
