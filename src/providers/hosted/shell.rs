//! POSIX shell command lines for providers whose exec takes one string (Runloop,
//! Cloudflare's bridge, Daytona's toolbox, Blaxel's process API): every adapter quotes the
//! same way, so a word never becomes shell syntax.
//!
//! Contract:
//! - [`shell_quote`] leaves a word of plain characters as it is and single-quotes any other
//!   (`'` written as `'\''`): `sh` reads it back as exactly that word, whatever its bytes.
//! - [`quote_argv`] is the argv as one line of quoted words.
//! - [`command_line`] runs a spec as given: `cd <cwd> && K=V ... exec argv...`; an empty
//!   argv or an environment name that is not a shell name is `invalid`, never sent.

use crate::ops::ExecSpec;
use crate::providers::{OpError, OpErrorKind};

/// One argument quoted for a POSIX shell.
pub fn shell_quote(arg: &str) -> String {
    if !arg.is_empty()
        && arg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@%+,".contains(&b))
    {
        return arg.to_string();
    }
    format!("'{}'", arg.replace('\'', r"'\''"))
}

/// The argv as one line of quoted words.
pub fn quote_argv(argv: &[String]) -> String {
    argv.iter()
        .map(|arg| shell_quote(arg))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether `key` can name a shell variable.
fn is_shell_name(key: &str) -> bool {
    key.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The shell command line that runs `spec` as given: `cd <cwd> && K=V ... exec argv...`.
pub fn command_line(spec: &ExecSpec) -> Result<String, OpError> {
    if spec.argv.first().is_none_or(|p| p.is_empty()) {
        return Err(OpError::new(
            OpErrorKind::Invalid,
            "argv must name a program",
        ));
    }
    let mut line = String::new();
    if let Some(cwd) = &spec.cwd {
        line.push_str(&format!("cd {} && ", shell_quote(cwd)));
    }
    for (key, value) in &spec.env {
        if !is_shell_name(key) {
            return Err(OpError::new(
                OpErrorKind::Invalid,
                format!("{key:?} is not a valid environment variable name"),
            ));
        }
        line.push_str(&format!("{key}={} ", shell_quote(value)));
    }
    line.push_str("exec ");
    line.push_str(&quote_argv(&spec.argv));
    Ok(line)
}

#[cfg(test)]
#[path = "shell_tests.rs"]
mod tests;
