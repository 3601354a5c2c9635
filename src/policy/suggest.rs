//! Suggested narrow rules: for a refused (or audited) egress decision, the narrowest policy
//! change that allows exactly that destination for that workspace.
//!
//! Contract:
//! - The suggestion names one workspace (`input.sandbox.workspace`), one host (exact, no
//!   wildcard), one port, the request's method (or any, for a connect-phase record) and a
//!   path prefix: the request's path without its query, covering itself and what lies below
//!   it by whole segments (the bundled `egress.rego`'s `allow_requests` semantics). The
//!   caller may widen or change the method and path (`--method`, `--path`).
//! - Two forms: a `data.json` entry, mounted by its folder at
//!   `data.sandgate.workspaces[ws].allow_requests[<key>]` so each suggestion is a file of its
//!   own beside any other data (honoured by the bundled `egress.rego`); or a Rego file of
//!   `allow` rules in `package sandgate.egress` that needs no helper from other files.
//! - Every string from the record reaches the Rego text as a JSON string literal (valid Rego,
//!   escaped), and the workspace is refused as a folder name unless it is letters, digits,
//!   `.`, `_` and `-`: a hostile log line cannot inject rules or paths.
//! - Nothing is written to the policy directory: [`check`] evaluates the recorded input
//!   under a copy of it with the suggestion added.

use std::path::{Path, PathBuf};

use super::replay::{Answer, Recorded};
use super::{Layer, PolicyEngine};

#[derive(Debug, thiserror::Error)]
pub enum SuggestError {
    #[error("decision {id} is an egress decision policy allowed; there is nothing to suggest")]
    Allowed { id: String },
    #[error("decision {id} is a {layer} decision; suggest handles egress decisions")]
    Layer { id: String, layer: &'static str },
    #[error("decision {id}: the recorded input has no {field}")]
    Missing { id: String, field: &'static str },
    #[error("decision {id}: workspace {workspace:?} cannot name a data folder (letters, digits, '.', '_', '-')")]
    Workspace { id: String, workspace: String },
    #[error("--path must start with '/': {0:?}")]
    Path(String),
    #[error("--method must be an HTTP method token: {0:?}")]
    Method(String),
    #[error("checking the suggestion: {0}")]
    Check(String),
    #[error(transparent)]
    Policy(#[from] super::PolicyError),
}

/// The narrowest allow for one recorded egress refusal.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Suggestion {
    pub workspace: String,
    pub host: String,
    pub port: u16,
    /// Empty: any method.
    pub methods: Vec<String>,
    pub path_prefix: String,
}

/// What the caller asked to override.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub method: Option<String>,
    pub path: Option<String>,
}

impl Suggestion {
    /// The suggestion for `record`, a refused or audited egress decision.
    pub fn for_record(
        record: &Recorded,
        overrides: &Overrides,
    ) -> Result<Suggestion, SuggestError> {
        let id = || record.decision_id.clone();
        if record.layer != Layer::Egress {
            return Err(SuggestError::Layer {
                id: id(),
                layer: record.layer.as_str(),
            });
        }
        if record.recorded.outcome() == super::replay::ALLOW {
            return Err(SuggestError::Allowed { id: id() });
        }
        let input = &record.input;
        let missing = |field| SuggestError::Missing { id: id(), field };
        let workspace = input["sandbox"]["workspace"]
            .as_str()
            .ok_or_else(|| missing("sandbox.workspace"))?;
        if workspace.is_empty()
            || !workspace
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
            || workspace.starts_with('.')
        {
            return Err(SuggestError::Workspace {
                id: id(),
                workspace: workspace.into(),
            });
        }
        let host = input["destination"]["host"]
            .as_str()
            .ok_or_else(|| missing("destination.host"))?;
        let port = input["destination"]["port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(|| missing("destination.port"))?;
        let method = match &overrides.method {
            Some(m) if m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphabetic()) => {
                return Err(SuggestError::Method(m.clone()))
            }
            Some(m) => Some(m.to_ascii_uppercase()),
            None => input["request"]["method"]
                .as_str()
                .map(str::to_ascii_uppercase),
        };
        let path = match &overrides.path {
            Some(p) if !p.starts_with('/') => return Err(SuggestError::Path(p.clone())),
            Some(p) => p.clone(),
            None => input["request"]["path"]
                .as_str()
                .map(|p| p.split('?').next().unwrap_or("/").to_string())
                .unwrap_or_else(|| "/".into()),
        };
        Ok(Suggestion {
            workspace: workspace.into(),
            host: host.into(),
            port,
            methods: method.into_iter().collect(),
            path_prefix: path,
        })
    }

    /// A file-name-safe key, readable and unique per suggestion.
    pub fn key(&self) -> String {
        let text = format!(
            "{}-{}-{}{}",
            self.methods.first().map_or("any", String::as_str),
            self.host,
            self.port,
            self.path_prefix
        );
        let mut slug: String = text
            .to_ascii_lowercase()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .take(60)
            .collect();
        let entry = serde_json::to_vec(self).unwrap_or_default();
        let digest = ring::digest::digest(&ring::digest::SHA256, &entry);
        slug.push('-');
        slug.push_str(&hex::encode(&digest.as_ref()[..4]));
        slug
    }

    /// The `data.json` form: its path under the policy directory and its text.
    pub fn data_file(&self) -> (PathBuf, String) {
        let path = Path::new("sandgate/workspaces")
            .join(&self.workspace)
            .join("allow_requests")
            .join(self.key())
            .join("data.json");
        let entry = serde_json::json!({
            "host": self.host,
            "port": self.port,
            "methods": self.methods,
            "path_prefix": self.path_prefix,
        });
        let text = serde_json::to_string_pretty(&entry).unwrap_or_default();
        (path, format!("{text}\n"))
    }

    /// The Rego form: its path under the policy directory and its text.
    pub fn rego_file(&self, decision_id: &str) -> (PathBuf, String) {
        let lit = |s: &str| serde_json::Value::from(s).to_string();
        let target = format!(
            "\tinput.sandbox.workspace == {}\n\tinput.destination.host == {}\n\tinput.destination.port == {}\n",
            lit(&self.workspace),
            lit(&self.host),
            self.port
        );
        let method = match self.methods.first() {
            Some(m) => format!("\tupper(input.request.method) == {}\n", lit(m)),
            None => String::new(),
        };
        // `path + "/"` starts with `prefix + "/"` exactly when the path is the prefix or
        // lies below it by whole segments; a prefix ending in "/" covers all below it.
        let path = if self.path_prefix.ends_with('/') {
            format!(
                "\tstartswith(split(input.request.path, \"?\")[0], {})\n",
                lit(&self.path_prefix)
            )
        } else {
            format!(
                "\tstartswith(concat(\"\", [split(input.request.path, \"?\")[0], \"/\"]), {})\n",
                lit(&format!("{}/", self.path_prefix))
            )
        };
        let text = format!(
            "# Suggested by `sandgate policy suggest {decision_id}`: {} {}:{}{} for workspace {}.\n\
             # The connect phase opens the (inspected) tunnel; each request in it is checked.\n\
             package sandgate.egress\n\nimport rego.v1\n\n\
             allow if {{\n{target}\tinput.phase == \"connect\"\n}}\n\n\
             allow if {{\n{target}\tinput.phase == \"request\"\n{method}{path}}}\n",
            self.methods.first().map_or("any method", String::as_str),
            self.host,
            self.port,
            self.path_prefix,
            self.workspace,
        );
        (
            Path::new("suggested").join(format!("{}.rego", self.key())),
            text,
        )
    }
}

/// Evaluates `record`'s input under a copy of `dir` with `file` (relative path, text)
/// added: what the policy would answer once the suggestion is applied.
pub fn check(
    dir: &Path,
    file: &(PathBuf, String),
    record: &Recorded,
) -> Result<Answer, SuggestError> {
    let copy = tempfile::tempdir().map_err(|e| SuggestError::Check(e.to_string()))?;
    copy_tree(dir, copy.path())
        .map_err(|e| SuggestError::Check(format!("{}: {e}", dir.display())))?;
    let target = copy.path().join(&file.0);
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|e| SuggestError::Check(e.to_string()))?;
    }
    std::fs::write(&target, &file.1).map_err(|e| SuggestError::Check(e.to_string()))?;
    let engine = PolicyEngine::load(copy.path())?;
    Ok(record.evaluate(&engine).0)
}

/// Copies a policy directory (files and folders; symbolic links followed).
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let path = entry?.path();
        let dest = to.join(path.file_name().unwrap_or_default());
        if path.is_dir() {
            copy_tree(&path, &dest)?;
        } else {
            std::fs::copy(&path, &dest)?;
        }
    }
    Ok(())
}
