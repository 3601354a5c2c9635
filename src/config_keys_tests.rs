//! `deploy/sandgate.example.toml` says it documents every key: this holds it to that.
//!
//! The keys are not listed by hand (a list would drift exactly as the example did). They are
//! asked of the parser itself: a probe key put into a table that `deny_unknown_fields` guards
//! is refused with serde's "unknown field `…`, expected one of `a`, `b`…", which names every
//! field of that table. Each field is then probed in turn as a table, an array of tables and a
//! map of tables, and enums answer the same way with their variants ("unknown variant") or
//! their tag ("missing field `type`"). What the parser takes without complaint, or refuses as
//! a plain value, is a leaf.

use std::collections::BTreeSet;

use super::Config;

const PROBE: &str = "__sandgate_probe__";
/// Far deeper than any table of the config; stops a recursive type from looping.
const MAX_DEPTH: usize = 10;

/// One step from the root of the file to a table.
#[derive(Clone, Debug)]
enum Step {
    /// A key of the table.
    Field(String),
    /// The table is one element of an array of tables (`[[pools]]`).
    Each,
    /// The table is one value of a map with names the user chooses (`[simulated.<pool>]`).
    Any,
    /// The table is one variant of an internally tagged enum: `tag = "variant"` is in it.
    Tag(String, String),
}

/// The document with `leaf` at `steps`.
fn build(steps: &[Step], leaf: toml::Value) -> toml::Value {
    let Some((first, rest)) = steps.split_first() else {
        return leaf;
    };
    let inner = build(rest, leaf);
    match first {
        Step::Field(name) => table([(name.clone(), inner)]),
        Step::Each => toml::Value::Array(vec![inner]),
        Step::Any => table([("example-name".to_string(), inner)]),
        Step::Tag(tag, variant) => {
            let mut inner = inner;
            if let toml::Value::Table(t) = &mut inner {
                t.insert(tag.clone(), toml::Value::String(variant.clone()));
            }
            inner
        }
    }
}

fn table<const N: usize>(entries: [(String, toml::Value); N]) -> toml::Value {
    toml::Value::Table(entries.into_iter().collect())
}

/// The parser's complaint about the document with `leaf` at `steps`, or `None` when it
/// accepts it.
fn complaint(steps: &[Step], leaf: toml::Value) -> Option<String> {
    let toml::Value::Table(doc) = build(steps, leaf) else {
        unreachable!("the root is always a table")
    };
    let text = toml::to_string(&doc).expect("a probe document serializes");
    toml::from_str::<Config>(&text)
        .err()
        .map(|e| e.message().to_string())
}

/// Whether `value` is taken as a string at `steps`: the parser's only complaint, if any, is
/// a required key that the probe document leaves out elsewhere.
fn taken_as_string(steps: &[Step], value: &str) -> bool {
    complaint(steps, toml::Value::String(value.to_string()))
        .is_none_or(|m| m.starts_with("missing field"))
}

fn probe_table() -> toml::Value {
    table([(PROBE.to_string(), toml::Value::Integer(1))])
}

/// The backtick-quoted names after `expected` in a serde message.
fn expected_names(message: &str) -> Vec<String> {
    let Some((_, after)) = message.split_once("expected") else {
        return Vec::new();
    };
    after
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// What kind of value sits at `steps`, as far as a probe can tell.
enum Shape {
    /// A table with these keys (struct fields or externally tagged variants).
    Keys(Vec<String>),
    /// An internally tagged enum: its tag and variants.
    Tagged(String, Vec<String>),
    /// An array of whatever comes next.
    Array,
    /// A map with names the user chooses.
    Map,
    /// A value, or a table the parser takes whatever it holds.
    Leaf,
}

fn shape(steps: &[Step]) -> Shape {
    let Some(message) = complaint(steps, probe_table()) else {
        return Shape::Leaf;
    };
    let unknown_field = format!("unknown field `{PROBE}`");
    let unknown_variant = format!("unknown variant `{PROBE}`");
    if message.starts_with(&unknown_field) {
        return Shape::Keys(expected_names(&message));
    }
    if message.starts_with(&unknown_variant) {
        // An enum: its variants that carry data are keys (`source = { image = "…" }`); one
        // written as a plain string (`kind = "e2b"`) is a value of this key.
        let keyed: Vec<String> = expected_names(&message)
            .into_iter()
            .filter(|v| !taken_as_string(steps, v))
            .collect();
        return if keyed.is_empty() {
            Shape::Leaf
        } else {
            Shape::Keys(keyed)
        };
    }
    if message.contains("expected a sequence") || message.contains("expected an array") {
        return Shape::Array;
    }
    if message.starts_with("invalid type: integer `1`") {
        return Shape::Map;
    }
    if let Some(tag) = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next())
    {
        let tag_probe = table([(tag.to_string(), toml::Value::String(PROBE.into()))]);
        if let Some(m) = complaint(steps, tag_probe) {
            if m.starts_with(&unknown_variant) {
                return Shape::Tagged(tag.to_string(), expected_names(&m));
            }
        }
    }
    Shape::Leaf
}

/// Every key path under `steps` (named by `path`), as dotted paths with `*` for names the
/// user chooses.
fn explore(steps: &mut Vec<Step>, path: &str, out: &mut BTreeSet<String>) {
    if steps.len() > MAX_DEPTH {
        out.insert(path.to_string());
        return;
    }
    match shape(steps) {
        Shape::Leaf => {
            out.insert(path.to_string());
        }
        Shape::Keys(keys) => {
            for key in keys {
                steps.push(Step::Field(key.clone()));
                explore(steps, &join(path, &key), out);
                steps.pop();
            }
        }
        Shape::Tagged(tag, variants) => {
            out.insert(join(path, &tag));
            for variant in variants {
                steps.push(Step::Tag(tag.clone(), variant));
                explore(steps, path, out);
                steps.pop();
            }
        }
        Shape::Array => {
            steps.push(Step::Each);
            // An array of plain values is one key; an array of tables, its tables' keys.
            match shape(steps) {
                Shape::Leaf => {
                    out.insert(path.to_string());
                }
                _ => explore(steps, path, out),
            }
            steps.pop();
        }
        Shape::Map => {
            steps.push(Step::Any);
            match shape(steps) {
                Shape::Leaf => {
                    out.insert(path.to_string());
                }
                _ => explore(steps, &join(path, "*"), out),
            }
            steps.pop();
        }
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Every key the config parser accepts.
fn accepted_keys() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    explore(&mut Vec::new(), "", &mut out);
    out
}

/// The key paths the example file shows, set or commented out (`# key = …` under a
/// `[section]` or `# [section]` line), including the keys of inline tables.
fn documented_keys(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut section = String::new();
    for line in text.lines() {
        let line = line.trim_start().trim_start_matches('#').trim();
        if let Some(name) = section_header(line) {
            section = name;
            out.insert(section.clone());
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let path = join(&section, key);
        inline_keys(&path, value, &mut out);
        out.insert(path);
    }
    out
}

fn section_header(line: &str) -> Option<String> {
    let inner = line
        .strip_prefix("[[")
        .and_then(|l| l.split_once("]]"))
        .or_else(|| line.strip_prefix('[').and_then(|l| l.split_once(']')))?
        .0
        .trim();
    let valid = !inner.is_empty()
        && inner
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-<>".contains(c));
    valid.then(|| inner.to_string())
}

/// `key = { a = 1, b = { c = 2 } }` documents `key.a`, `key.b` and `key.b.c`; so does
/// `key = [{ a = 1 }, …]` for `key.a`.
fn inline_keys(path: &str, value: &str, out: &mut BTreeSet<String>) {
    if let Ok(mut t) = format!("v = {}", value.trim()).parse::<toml::Table>() {
        if let Some(v) = t.remove("v") {
            value_keys(path, &v, out);
        }
    }
}

fn value_keys(path: &str, value: &toml::Value, out: &mut BTreeSet<String>) {
    match value {
        toml::Value::Table(t) => {
            for (key, inner) in t {
                let inner_path = join(path, key);
                value_keys(&inner_path, inner, out);
                out.insert(inner_path);
            }
        }
        toml::Value::Array(items) => items.iter().for_each(|v| value_keys(path, v, out)),
        _ => {}
    }
}

/// Whether the example documents `key`: the same path, where `*` (a name the user chooses)
/// stands for any one name.
fn documents(documented: &BTreeSet<String>, key: &str) -> bool {
    let wanted: Vec<&str> = key.split('.').collect();
    documented.iter().any(|d| {
        let have: Vec<&str> = d.split('.').collect();
        have.len() == wanted.len() && have.iter().zip(&wanted).all(|(h, w)| *w == "*" || h == w)
    })
}

#[test]
fn the_probe_finds_keys_of_every_shape() {
    let keys = accepted_keys();
    for expected in [
        "proxy.listen",                    // a plain key
        "create.janitor_interval_ms",      // the one a user found missing
        "pools.name",                      // an array of tables
        "simulated.*.capacity",            // a map of tables
        "credentials.apply.type",          // an internally tagged enum's tag
        "credentials.apply.template",      // ... and a variant's field
        "egress.identities.allow_domains", // an array of tables inside a table
    ] {
        assert!(keys.contains(expected), "{expected} not found in {keys:#?}");
    }
    assert!(!keys.iter().any(|k| k.contains(PROBE)), "{keys:#?}");
}

#[test]
fn the_example_config_documents_every_key_the_parser_accepts() {
    let documented = documented_keys(include_str!("../deploy/sandgate.example.toml"));
    let missing: Vec<String> = accepted_keys()
        .into_iter()
        .filter(|key| !documents(&documented, key))
        .collect();
    assert!(
        missing.is_empty(),
        "deploy/sandgate.example.toml does not document these keys (add each, set or as \
         `# key = …` under its section): {missing:#?}"
    );
}

#[test]
fn the_example_config_documents_no_key_the_parser_refuses() {
    let accepted = accepted_keys();
    let documented = documented_keys(include_str!("../deploy/sandgate.example.toml"));
    let unknown: Vec<&String> = documented
        .iter()
        .filter(|d| {
            let have: Vec<&str> = d.split('.').collect();
            // Known when it leads to an accepted key (a section), or lies inside one whose
            // contents the parser takes as they come (labels, provider options).
            !accepted.iter().any(|a| {
                let want: Vec<&str> = a.split('.').collect();
                have.iter().zip(&want).all(|(h, w)| *w == "*" || h == w)
            })
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "deploy/sandgate.example.toml shows keys the parser does not accept: {unknown:#?}"
    );
}
