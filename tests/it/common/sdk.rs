//! The official provider SDKs the fakes are proven with (`tests/it/*_fake.rs`): which Python
//! runs them and whether it has the SDK. `.ci/run` installs `tests/sdk/requirements.txt`
//! into the venv of [`DEFAULT_VENV_PYTHON`]; `SANDGATE_SDK_PYTHON` names another interpreter.

use std::path::{Path, PathBuf};

pub const DEFAULT_VENV_PYTHON: &str = "/opt/sandgate-sdk-venv/bin/python";

/// `SANDGATE_SDK_PYTHON`, else the venv `.ci/run` makes, else `python3`.
pub fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("SANDGATE_SDK_PYTHON").filter(|v| !v.is_empty()) {
        return PathBuf::from(python);
    }
    if Path::new(DEFAULT_VENV_PYTHON).is_file() {
        return PathBuf::from(DEFAULT_VENV_PYTHON);
    }
    PathBuf::from("python3")
}

/// `Some(reason)` when `python` cannot import `module`.
pub fn missing(python: &Path, module: &str) -> Option<String> {
    match std::process::Command::new(python)
        .args(["-c", &format!("import {module}")])
        .output()
    {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!(
            "{} cannot import {module}: {}",
            python.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Some(format!("{} does not run: {e}", python.display())),
    }
}
