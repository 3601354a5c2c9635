//! Observe-only rollout: denials that are recorded, counted and not enforced.
//!
//! Contract (every layer, decided in one place: [`super::PolicyEngine::decide`]):
//! - **A rule**: a layer's package (platform or workspace scope) may define `audit_deny`, a
//!   set of reason strings like `deny`. Its entries never refuse: when the layer otherwise
//!   allows, the operation proceeds and the decision carries them as `would_deny`.
//! - **A whole layer**: `data.sandgate.audit.layers` (an array of layer names, from a
//!   `data.json` or a Rego rule) puts every policy refusal of those layers, in every scope,
//!   `deny` entries and missing `allow` alike, in `would_deny` and lets the operation
//!   proceed. An evaluation error and a layer with no package still refuse: audit observes
//!   a policy, it never turns a broken or missing one into an open door.
//! - An enforced refusal wins: with `deny` non-empty (or no `allow`) in a layer not audited
//!   as a whole, the operation is refused and `would_deny` is empty (nothing was let
//!   through).
//! - Every decision let through with a `would_deny` counts once in
//!   `sandgate_policy_would_deny_total{layer}`, and its log record's `result` (for egress,
//!   `policy_result` and `result`) carries `would_deny: [reasons]`.
//! - Enforcing is a policy change like any other: rename `audit_deny` to `deny`, or drop the
//!   layer from `data.sandgate.audit.layers`; replay (`sandgate policy replay`) reports the
//!   `would-deny→deny` flips the change makes.
//!
//! Rego METADATA annotations are not used: regorus 0.14 does not expose them on rules, and
//! a rule name is visible in the policy text and to `policy test` alike.

use regorus::Value;

use super::{Decision, PolicyError, LAYERS};

/// The rule in a layer's package whose reasons are recorded, not enforced.
pub const AUDIT_RULE: &str = "audit_deny";

/// Where the layers audited as a whole are listed.
pub const AUDIT_LAYERS_REF: &str = "data.sandgate.audit.layers";

/// The layers `data.sandgate.audit.layers` audits as a whole, read once per generation. An
/// unknown name or a value that is not an array of strings rejects the generation, so a
/// typo never silently leaves a layer enforced (or a reader guessing).
pub(crate) fn audited_layers(
    engine: &mut regorus::Engine,
) -> Result<Vec<&'static str>, PolicyError> {
    engine.set_input(Value::new_object());
    let results = engine
        .eval_query(AUDIT_LAYERS_REF.to_string(), false)
        .map_err(|e| PolicyError::Compile(format!("{AUDIT_LAYERS_REF}: {e}")))?;
    let value = results
        .result
        .first()
        .and_then(|r| r.expressions.first())
        .map(|e| e.value.clone());
    let Some(value) = value.filter(|v| *v != Value::Undefined) else {
        return Ok(Vec::new());
    };
    let bad = |why: String| PolicyError::Compile(format!("{AUDIT_LAYERS_REF}: {why}"));
    let items = value
        .as_array()
        .map_err(|_| bad("must be an array of layer names".into()))?;
    let mut layers = Vec::new();
    for item in items.iter() {
        let name = item
            .as_string()
            .map_err(|_| bad("must be an array of layer names".into()))?;
        let layer = LAYERS
            .iter()
            .find(|l| **l == name.as_ref())
            .ok_or_else(|| bad(format!("unknown layer {name:?} (known: {LAYERS:?})")))?;
        layers.push(*layer);
    }
    Ok(layers)
}

/// Settles a composed policy decision under audit. On entry `decision.would_deny` holds the
/// scopes' `audit_deny` reasons; `layer_audited` says whether the layer is audited as a
/// whole. Counts the decision when it is let through with a would-deny.
pub(crate) fn settle(layer: &'static str, decision: &mut Decision, layer_audited: bool) {
    if !decision.allowed && layer_audited {
        let mut refused = std::mem::take(&mut decision.reasons);
        refused.append(&mut decision.would_deny);
        decision.would_deny = refused;
        decision.allowed = true;
        decision.deny_scope = None;
        decision.default_deny = false;
    } else if !decision.allowed {
        // Refused anyway: nothing was let through, so there is nothing to observe.
        decision.would_deny.clear();
    }
    decision.would_deny.sort();
    decision.would_deny.dedup();
    if !decision.would_deny.is_empty() {
        metrics::counter!("sandgate_policy_would_deny_total", "layer" => layer).increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn decision(allowed: bool, reasons: &[&str], audit: &[&str]) -> Decision {
        Decision {
            allowed,
            reasons: reasons.iter().map(|r| r.to_string()).collect(),
            action: "inspect".into(),
            generation: 1,
            eval_time: Duration::ZERO,
            decision_id: None,
            deny_scope: (!allowed).then(|| Arc::from("platform")),
            default_deny: false,
            logged: None,
            would_deny: audit.iter().map(|r| r.to_string()).collect(),
            deny_mode: None,
        }
    }

    #[test]
    fn an_enforced_refusal_wins_over_an_audited_one() {
        let mut d = decision(false, &["enforced"], &["audited"]);
        settle("egress", &mut d, false);
        assert!(!d.allowed);
        assert_eq!(d.reasons, ["enforced"]);
        assert!(d.would_deny.is_empty());
    }

    #[test]
    fn an_audited_rule_lets_an_allowed_operation_through_and_says_why() {
        let mut d = decision(true, &[], &["b", "a", "a"]);
        settle("egress", &mut d, false);
        assert!(d.allowed);
        assert_eq!(d.would_deny, ["a", "b"]);
    }

    #[test]
    fn a_layer_audited_as_a_whole_lets_every_refusal_through() {
        let mut d = decision(false, &["no rule allowed this (default deny)"], &["x"]);
        settle("action", &mut d, true);
        assert!(d.allowed && d.reasons.is_empty() && d.deny_scope.is_none());
        assert_eq!(d.would_deny, ["no rule allowed this (default deny)", "x"]);
    }

    fn engine(rego: &str) -> regorus::Engine {
        let mut engine = regorus::Engine::new();
        engine.set_rego_v0(false);
        engine.add_policy("a.rego".into(), rego.into()).unwrap();
        engine
    }

    #[test]
    fn audited_layers_are_read_from_data_or_rules_and_typos_refused() {
        let mut none = engine("package x\nimport rego.v1\ny := 1\n");
        assert!(audited_layers(&mut none).unwrap().is_empty());
        let mut some =
            engine("package sandgate.audit\nimport rego.v1\nlayers := [\"egress\", \"action\"]\n");
        assert_eq!(audited_layers(&mut some).unwrap(), ["egress", "action"]);
        let mut typo = engine("package sandgate.audit\nimport rego.v1\nlayers := [\"egres\"]\n");
        let e = audited_layers(&mut typo).unwrap_err().to_string();
        assert!(e.contains("unknown layer \"egres\""), "{e}");
        let mut shape = engine("package sandgate.audit\nimport rego.v1\nlayers := \"egress\"\n");
        let e = audited_layers(&mut shape).unwrap_err().to_string();
        assert!(e.contains("array of layer names"), "{e}");
    }
}
