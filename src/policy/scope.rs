//! Policy scopes: which rules apply to which inputs, decided by where a file lives.
//!
//! - The **platform** scope: files at the top of the policy directory or under `platform/`,
//!   packages `sandgate.<layer>`. Required: a layer with no platform package denies.
//! - A **workspace** scope: files under `workspaces/<ws>/`, packages
//!   `sandgate.scopes.workspaces.<ws>.<layer>` (helpers below that prefix). Applied, in
//!   addition to the platform scope, when the input's workspace is `<ws>`.
//!
//! The package must match the directory, checked at load (and by `policy check`) with the
//! file and line: the directory is the ownership boundary (a workspace's team may own its
//! folder), and Rego merges every file of a package, so a workspace file declaring
//! `package sandgate.creation` would add an `allow` rule to the platform's and restore
//! authority the platform denied. Workspace packages live apart from `data.sandgate.workspaces`
//! (the platform's per-workspace data): a platform rule looking up
//! `data.sandgate.workspaces[input.workspace]` would otherwise also evaluate (and could be
//! shadowed or broken by) workspace-authored rules.

use super::{PolicyError, LAYERS};

/// Package prefix of workspace scopes (`data.` form, as regorus reports packages).
pub(crate) const WORKSPACE_PREFIX: &str = "data.sandgate.scopes.workspaces.";

/// Where a file's rules apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FileScope {
    Platform,
    Workspace(String),
}

/// The scope of a file at `rel` (relative to the policy directory).
pub(crate) fn file_scope(rel: &str) -> Result<FileScope, PolicyError> {
    let parts: Vec<&str> = rel.split(['/', '\\']).collect();
    if parts.first() != Some(&"workspaces") {
        return Ok(FileScope::Platform);
    }
    if parts.len() < 3 {
        return Err(PolicyError::Scope {
            file: rel.to_string(),
            line: 1,
            reason: "a file under workspaces/ belongs in a workspace's folder, workspaces/<ws>/"
                .into(),
        });
    }
    let ws = parts[1];
    if !valid_workspace(ws) {
        return Err(PolicyError::Scope {
            file: rel.to_string(),
            line: 1,
            reason: format!(
                "workspace folder {ws:?}: use letters, digits, `_` and `-` (it becomes part of a package name)"
            ),
        });
    }
    Ok(FileScope::Workspace(ws.to_string()))
}

fn valid_workspace(ws: &str) -> bool {
    !ws.is_empty()
        && ws
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Checks that `package` (regorus's `data.a.b` form) may be declared by a file at `rel`.
pub(crate) fn check_package(rel: &str, text: &str, package: &str) -> Result<(), PolicyError> {
    let scope = file_scope(rel)?;
    let fail = |reason: String| PolicyError::Scope {
        file: rel.to_string(),
        line: package_line(text),
        reason,
    };
    let shown = package.strip_prefix("data.").unwrap_or(package);
    let reserved = package == WORKSPACE_PREFIX.trim_end_matches('.')
        || package.starts_with(WORKSPACE_PREFIX)
        || package == "data.sandgate.scopes";
    match scope {
        FileScope::Platform if reserved => Err(fail(format!(
            "package {shown} is a workspace scope's: put the file in workspaces/<ws>/"
        ))),
        FileScope::Platform => Ok(()),
        FileScope::Workspace(ws) => {
            let own = format!("{WORKSPACE_PREFIX}{ws}");
            if package == own || package.starts_with(&format!("{own}.")) {
                Ok(())
            } else {
                Err(fail(format!(
                    "package {shown} does not match its folder workspaces/{ws}/: declare package sandgate.scopes.workspaces.{} (for example sandgate.scopes.workspaces.{}.creation)",
                    rego_segment(&ws), rego_segment(&ws)
                )))
            }
        }
    }
}

/// The 1-based line of the `package` statement (1 when it cannot be found).
fn package_line(text: &str) -> usize {
    text.lines()
        .position(|l| {
            let l = l.trim_start();
            l.starts_with("package ") || l.starts_with("package\t")
        })
        .map(|i| i + 1)
        .unwrap_or(1)
}

/// `(workspace, layer)` when `package` is a workspace scope's layer package.
pub(crate) fn scope_layer(package: &str) -> Option<(String, &'static str)> {
    let rest = package.strip_prefix(WORKSPACE_PREFIX)?;
    let (ws, layer) = rest.split_once('.')?;
    let layer = LAYERS.iter().copied().find(|l| *l == layer)?;
    Some((ws.to_string(), layer))
}

/// A path segment as Rego writes it: `.name` for identifiers, `["ws-a"]` otherwise.
fn rego_segment(name: &str) -> String {
    let ident = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ident {
        format!(".{name}")
    } else {
        format!("[{name:?}]")
    }
}

/// `data.sandgate.scopes.workspaces.<ws>.<layer>` as a Rego reference (and as regorus
/// names the rules under it).
pub(crate) fn workspace_ref(ws: &str, layer: &str) -> String {
    format!(
        "data.sandgate.scopes.workspaces{}.{layer}",
        rego_segment(ws)
    )
}

/// The scope's name in decisions and logs.
pub(crate) fn workspace_scope_name(ws: &str) -> String {
    format!("workspaces/{ws}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packages_must_match_their_folder() {
        let text = "# comment\n\npackage sandgate.creation\n";
        assert!(check_package("creation.rego", text, "data.sandgate.creation").is_ok());
        assert!(check_package("platform/x.rego", text, "data.sandgate.creation").is_ok());
        let own = "data.sandgate.scopes.workspaces.acme.creation";
        assert!(check_package("workspaces/acme/c.rego", text, own).is_ok());
        assert!(check_package(
            "workspaces/acme/lib/u.rego",
            text,
            "data.sandgate.scopes.workspaces.acme.lib"
        )
        .is_ok());
        let e = check_package("workspaces/acme/c.rego", text, "data.sandgate.creation")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("workspaces/acme/c.rego:3: "), "{e}");
        let e = check_package("workspaces/other/c.rego", text, own)
            .unwrap_err()
            .to_string();
        assert!(e.contains("workspaces/other/"), "{e}");
        let e = check_package("acme.rego", text, own)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("acme.rego:3: "), "{e}");
        assert!(check_package("workspaces/x.rego", text, own).is_err());
        assert!(check_package("workspaces/a b/x.rego", text, own).is_err());
    }

    #[test]
    fn references_quote_names_that_are_not_identifiers() {
        assert_eq!(
            workspace_ref("acme", "egress"),
            "data.sandgate.scopes.workspaces.acme.egress"
        );
        assert_eq!(
            workspace_ref("ws-a", "egress"),
            "data.sandgate.scopes.workspaces[\"ws-a\"].egress"
        );
        assert_eq!(
            scope_layer("data.sandgate.scopes.workspaces.ws-a.creation"),
            Some(("ws-a".into(), "creation"))
        );
        assert_eq!(
            scope_layer("data.sandgate.scopes.workspaces.ws-a.lib"),
            None
        );
    }
}
