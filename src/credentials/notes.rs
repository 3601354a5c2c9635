//! Why a workspace credential was not applied to a request, for the egress decision record
//! (`credential_notes`): one line per credential bound to the sandbox whose destination
//! hosts match the request's host but which was not applied.
//!
//! Contract: a note names the credential and the first rule that left it out, in order —
//! plain HTTP, `ports` (empty means `[443]`), `methods`, `path_prefix`, then a policy
//! refusal of its use (`sandgate.credential`). It carries configuration, the request's
//! method, port and path (no query), never a secret or a placeholder (the caller redacts
//! placeholders from the path as it does for the record's `path`). Nothing is computed for
//! a sandbox with no bindings, and a binding whose destinations do not name the host costs
//! one host comparison per rule.

use super::apply::RequestView;
use super::{CredentialStore, DestinationRule};
use crate::error::Error;
use crate::identity::Identity;

/// Notes for every credential of `identity` whose destination hosts match the request but
/// that is not in `applied`. `refused` is the error that stopped credential use, if any: a
/// policy refusal (`credential_denied`) is the note of the credential it names.
pub fn not_applied(
    credentials: &CredentialStore,
    identity: &Identity,
    view: &RequestView<'_>,
    path: &str,
    applied: &[String],
    refused: Option<&Error>,
) -> Vec<String> {
    if identity.bindings.is_empty() {
        return Vec::new();
    }
    let mut notes = Vec::new();
    for binding in &identity.bindings {
        if applied.contains(&binding.name) {
            continue;
        }
        let Some(credential) = credentials.get(&identity.workspace, &binding.name) else {
            continue;
        };
        let for_host: Vec<&DestinationRule> = credential
            .meta
            .destinations
            .iter()
            .filter(|d| crate::domain::matches(&d.host, view.host))
            .collect();
        if for_host.is_empty() {
            continue;
        }
        let why = policy_refusal(refused, &binding.name)
            .or_else(|| rule_refusal(&for_host, view, path))
            .unwrap_or_else(|| "not applied: the request stopped before credentials".into());
        notes.push(format!("credential {:?}: {why}", binding.name));
    }
    notes
}

fn policy_refusal(refused: Option<&Error>, name: &str) -> Option<String> {
    let error = refused.filter(|e| e.code == "credential_denied")?;
    if error.details.credential.as_deref() != Some(name) {
        return None;
    }
    let reasons = error.details.reasons.as_deref().unwrap_or_default();
    Some(format!(
        "policy refused credential use: {}",
        reasons.join("; ")
    ))
}

/// The first destination rule that leaves the request out, over the rules naming its host.
fn rule_refusal(rules: &[&DestinationRule], view: &RequestView<'_>, path: &str) -> Option<String> {
    if view.scheme != "https" {
        return Some("plain HTTP: credentials are applied only over HTTPS".into());
    }
    let for_port: Vec<&DestinationRule> = rules
        .iter()
        .copied()
        .filter(|d| d.covers(view.host, view.port))
        .collect();
    if for_port.is_empty() {
        return Some(format!(
            "port {} not in {}",
            view.port,
            any_of(rules, ports)
        ));
    }
    let method_ok = |d: &&DestinationRule| {
        d.methods.is_empty()
            || d.methods
                .iter()
                .any(|m| m.eq_ignore_ascii_case(view.method))
    };
    let for_method: Vec<&DestinationRule> = for_port.into_iter().filter(method_ok).collect();
    if for_method.is_empty() {
        let methods = |d: &DestinationRule| format!("methods [{}]", d.methods.join(", "));
        return Some(format!(
            "method {} not in {}",
            view.method,
            any_of(rules, methods)
        ));
    }
    let prefix_ok =
        |d: &&DestinationRule| d.path_prefix.as_deref().is_none_or(|p| path.starts_with(p));
    if !for_method.iter().any(prefix_ok) {
        let prefixes = |d: &DestinationRule| {
            format!("path_prefix {}", d.path_prefix.as_deref().unwrap_or("/"))
        };
        return Some(format!(
            "path {path} outside {}",
            any_of(&for_method, prefixes)
        ));
    }
    None
}

fn ports(d: &DestinationRule) -> String {
    if d.ports.is_empty() {
        "ports [443] (ports default to [443])".into()
    } else {
        format!("ports {:?}", d.ports)
    }
}

/// `what` of each rule, joined with " or ".
fn any_of(rules: &[&DestinationRule], what: impl Fn(&DestinationRule) -> String) -> String {
    let mut shown: Vec<String> = rules.iter().map(|d| what(d)).collect();
    shown.dedup();
    shown.join(" or ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(ports: &[u16], methods: &[&str], prefix: Option<&str>) -> DestinationRule {
        DestinationRule {
            host: "api.test".into(),
            ports: ports.to_vec(),
            methods: methods.iter().map(|m| m.to_string()).collect(),
            path_prefix: prefix.map(str::to_string),
        }
    }

    fn view<'a>(port: u16, method: &'a str) -> RequestView<'a> {
        RequestView {
            host: "api.test",
            port,
            scheme: "https",
            method,
            destination: regorus::Value::Null,
            sandbox: regorus::Value::Null,
        }
    }

    #[test]
    fn each_rule_is_named_with_what_it_allows() {
        let default_ports = rule(&[], &[], None);
        assert_eq!(
            rule_refusal(&[&default_ports], &view(8443, "GET"), "/").unwrap(),
            "port 8443 not in ports [443] (ports default to [443])"
        );
        let get_only = rule(&[443], &["GET"], None);
        assert_eq!(
            rule_refusal(&[&get_only], &view(443, "POST"), "/").unwrap(),
            "method POST not in methods [GET]"
        );
        let api = rule(&[], &[], Some("/api"));
        assert_eq!(
            rule_refusal(&[&api], &view(443, "GET"), "/x").unwrap(),
            "path /x outside path_prefix /api"
        );
        assert_eq!(rule_refusal(&[&api], &view(443, "GET"), "/api/v1"), None);
    }
}
