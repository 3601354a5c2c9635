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
    #[arg(long)]
    pub decisions: PathBuf,
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
        .and_then(|engine| replay::replay(&args.decisions, &engine));
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
