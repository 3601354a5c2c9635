//! `sandgate policy test` and `policy check`: run the `test_*` rules of `*_test.rego` files
//! the way `opa test` does, and compile a directory reporting `file:line` on error.

use std::path::Path;
use std::time::{Duration, Instant};

use regorus::Value;

use super::{build_engine, PolicyError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    /// The rule was false or undefined.
    Fail,
    /// Evaluation raised an error (its message).
    Error(String),
}

#[derive(Debug, Clone)]
pub struct TestResult {
    pub file: String,
    pub name: String,
    pub outcome: Outcome,
    pub duration: Duration,
}

#[derive(Debug, Default)]
pub struct Report {
    pub results: Vec<TestResult>,
}

impl Report {
    pub fn passed(&self) -> usize {
        self.results
            .iter()
            .filter(|r| r.outcome == Outcome::Pass)
            .count()
    }

    pub fn failed(&self) -> usize {
        self.results.len() - self.passed()
    }
}

/// Compiles every policy and test file in `dir`: the policies exactly as the server loads
/// them (the same build, per-layer compilation and evaluator agreement included, so what
/// passes here is what `serve` accepts), then the test files with them.
pub fn check(dir: &Path) -> Result<Vec<String>, PolicyError> {
    super::PolicyEngine::load(dir)?;
    let super::Loaded {
        mut engine, names, ..
    } = build_engine(dir, true)?;
    // Evaluating a trivially defined query forces whole-program checks (unsafe variables,
    // rule conflicts, unknown functions) that parsing alone does not make.
    engine.set_input(Value::new_object());
    engine
        .eval_query("true".to_string(), false)
        .map_err(|e| PolicyError::Compile(e.to_string()))?;
    Ok(names)
}

/// Runs every `test_*` rule of every `*_test.rego` file under `dir`, optionally only those
/// whose `package.rule` name contains `filter`.
pub fn run(dir: &Path, filter: Option<&str>) -> Result<Report, PolicyError> {
    let engine = build_engine(dir, true)?.engine;
    let mut report = Report::default();
    for (file, package, rule) in discover(dir)? {
        let full = format!("{package}.{rule}");
        if filter.is_some_and(|f| !full.contains(f)) {
            continue;
        }
        let mut engine = engine.clone();
        engine.set_input(Value::new_object());
        let started = Instant::now();
        let outcome = match engine.eval_rule(format!("data.{full}")) {
            Ok(Value::Bool(true)) => Outcome::Pass,
            Ok(_) => Outcome::Fail,
            Err(e) => Outcome::Error(e.to_string()),
        };
        report.results.push(TestResult {
            file,
            name: full,
            outcome,
            duration: started.elapsed(),
        });
    }
    Ok(report)
}

/// `(file, package, rule)` for every test rule, in file order.
fn discover(dir: &Path) -> Result<Vec<(String, String, String)>, PolicyError> {
    let files = super::walk(dir)?;
    let mut out = Vec::new();
    for (rel, path) in files.tests {
        let text = std::fs::read_to_string(&path).map_err(|e| PolicyError::File {
            file: rel.clone(),
            reason: e.to_string(),
        })?;
        let Some(package) = text.lines().find_map(|l| {
            l.trim()
                .strip_prefix("package ")
                .map(|p| p.trim().to_string())
        }) else {
            continue;
        };
        let mut seen = std::collections::BTreeSet::new();
        for line in text.lines() {
            // Rules start at column 0; `test_x if {` and `test_x := ...` both count.
            let Some(rest) = line.strip_prefix("test_") else {
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let rule = format!("test_{name}");
            if seen.insert(rule.clone()) {
                out.push((rel.clone(), package.clone(), rule));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `test_*` rule under `dir` (relative to the crate) passes, and there are at
    /// least `min` of them (so a directory that stopped loading cannot pass by being empty).
    fn all_pass(dir: &str, min: usize) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        let report = run(&dir, None).unwrap();
        assert!(
            report.results.len() >= min,
            "found {} tests",
            report.results.len()
        );
        let failures: Vec<_> = report
            .results
            .iter()
            .filter(|r| r.outcome != Outcome::Pass)
            .collect();
        assert!(failures.is_empty(), "{failures:#?}");
    }

    #[test]
    fn example_policy_tests_pass() {
        all_pass("examples/policies", 12);
    }

    #[test]
    fn bundled_policy_tests_pass() {
        all_pass("policies", 10);
    }

    #[test]
    fn a_failing_test_is_reported_as_failed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("p.rego"),
            "package p\nimport rego.v1\nallow if input.x == 1\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("p_test.rego"),
            "package p_test\nimport rego.v1\nimport data.p\ntest_ok if p.allow with input as {\"x\": 1}\ntest_wrong if p.allow with input as {\"x\": 2}\n",
        )
        .unwrap();
        let report = run(dir.path(), None).unwrap();
        assert_eq!(report.passed(), 1);
        assert_eq!(report.failed(), 1);
        assert_eq!(report.results[1].name, "p_test.test_wrong");
        assert!(check(dir.path()).is_ok());
        std::fs::write(dir.path().join("bad.rego"), "package bad\nallow if {{\n").unwrap();
        let err = check(dir.path()).unwrap_err().to_string();
        assert!(err.contains("bad.rego"), "{err}");
    }
}
