//! `sandgate policy suggest DECISION_ID --decisions FILE [--dir DIR] [--format data|rego]
//! [--method M] [--path P] [--no-check]`: prints the narrowest policy change that allows the
//! refused egress decision (see [`crate::policy::suggest`]). The file's text goes to stdout,
//! exactly as it is to be saved; where to save it and what the check found go to stderr.
//! Nothing is written. Exit codes: 0 the suggestion allows the recorded request (or
//! `--no-check`), 1 it does not (another rule still refuses it), 2 an error.

use std::io::Write;
use std::path::PathBuf;

use crate::policy::replay;
use crate::policy::suggest::{self, Overrides, Suggestion};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A `data.json` entry for the bundled egress policy's `allow_requests`.
    Data,
    /// A Rego file of `allow` rules in `package sandgate.egress`.
    Rego,
}

/// The arguments of `sandgate policy suggest`.
#[derive(Debug, clap::Args)]
pub struct SuggestArgs {
    /// The refused decision's `decision_id`.
    pub decision_id: String,
    /// Decision log (JSON lines, as `[log] decisions` writes it).
    #[arg(long)]
    pub decisions: PathBuf,
    /// Policy directory to check the suggestion against (default: the config's
    /// `[policy] dir`).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// What to print: a `data.json` entry or a Rego rule.
    #[arg(long, value_enum, default_value = "data")]
    pub format: Format,
    /// Allow this method instead of the recorded one.
    #[arg(long)]
    pub method: Option<String>,
    /// Allow this path prefix instead of the recorded path.
    #[arg(long)]
    pub path: Option<String>,
    /// Do not evaluate the recorded input under the policy plus the suggestion.
    #[arg(long)]
    pub no_check: bool,
}

/// Runs the command with `dir` as the policy directory.
pub fn suggest(
    args: &SuggestArgs,
    dir: &std::path::Path,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    match run(args, dir, out, err) {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            2
        }
    }
}

fn run(
    args: &SuggestArgs,
    dir: &std::path::Path,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, Box<dyn std::error::Error>> {
    let record = replay::find(&args.decisions, &args.decision_id)?;
    let overrides = Overrides {
        method: args.method.clone(),
        path: args.path.clone(),
    };
    let suggestion = Suggestion::for_record(&record, &overrides)?;
    let file = match args.format {
        Format::Data => suggestion.data_file(),
        Format::Rego => suggestion.rego_file(&record.decision_id),
    };
    write!(out, "{}", file.1)?;
    writeln!(err, "save as: {}", dir.join(&file.0).display())?;
    if args.no_check {
        return Ok(0);
    }
    let answer = suggest::check(dir, &file, &record)?;
    if answer.allow && answer.would_deny.is_empty() {
        writeln!(
            err,
            "check: allow (the recorded request, under the policy plus this file)"
        )?;
        Ok(0)
    } else {
        let reasons: Vec<&str> = answer
            .deny
            .iter()
            .chain(&answer.would_deny)
            .map(String::as_str)
            .collect();
        writeln!(
            err,
            "check: deny (still refused by: {})",
            reasons.join("; ")
        )?;
        Ok(1)
    }
}
