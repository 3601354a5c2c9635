//! A policy input written as JSON with the decision log's redaction applied on the way: one
//! pass over the engine's own value straight into the record's bytes.
//!
//! The general path ([`super::LoggedInput::to_json`]) converts the input to a
//! `serde_json::Value` tree, rewrites it ([`super::redact_input`], [`super::summarize_argv`])
//! and serializes the tree: three passes and an allocation per node, which made the
//! decision log the largest single cost of a keep-alive request (about 50k instructions of
//! the writer thread per record). This writer gives the same document for the inputs every
//! request produces, and declines ([`Declined`]) the shapes whose redaction changes the
//! structure rather than a value, which then take the general path:
//! - an object key that is not a string, or that mentions a credential placeholder (the
//!   general path renames such keys, and two renamed keys may merge);
//! - a top-level `exec` whose argv is to be summarised (`[log] full_argv = false`).
//!
//! Values are redacted exactly as [`super::redact_input`] does: the value of a key named
//! like an authenticating header (any case, unless null) becomes `"[redacted]"`; a string
//! under a key named `path` loses its query values; any string mentioning a placeholder is
//! [`crate::base::scan::redact`]ed. `render_tests.rs` holds the two paths to the same
//! document over generated inputs.

use regorus::Value;

use super::{redact_query, REDACTED, SECRET_KEYS};
use crate::base::scan;

/// The input has a shape only the general path redacts correctly.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Declined;

/// Appends `input` as redacted JSON to `out`; on [`Declined`], `out` may hold a partial
/// document and must be truncated by the caller.
pub(super) fn write_input(
    input: &Value,
    full_argv: bool,
    out: &mut Vec<u8>,
) -> Result<(), Declined> {
    if !full_argv {
        if let Value::Object(fields) = input {
            if fields.get(&Value::from("exec")).is_some() {
                return Err(Declined);
            }
        }
    }
    write_value(input, out)
}

fn write_value(value: &Value, out: &mut Vec<u8>) -> Result<(), Declined> {
    match value {
        Value::String(s) => write_str(&scan::redact(s), out),
        Value::Array(items) => write_seq(items.iter(), out)?,
        Value::Set(items) => write_seq(items.iter_sorted(), out)?,
        Value::Object(fields) => {
            out.push(b'{');
            for (i, (key, value)) in fields.iter_sorted().enumerate() {
                let Value::String(key) = key else {
                    return Err(Declined);
                };
                if scan::mentions_placeholder(key.as_bytes()) {
                    return Err(Declined);
                }
                if i > 0 {
                    out.push(b',');
                }
                write_str(key, out);
                out.push(b':');
                write_field(key, value, out)?;
            }
            out.push(b'}');
        }
        // Null, booleans, numbers and undefined: as the engine's own serializer writes them.
        other => serde_json::to_writer(&mut *out, other).map_err(|_| Declined)?,
    }
    Ok(())
}

/// An object's value under `key`, with the key's own redaction rule.
fn write_field(key: &str, value: &Value, out: &mut Vec<u8>) -> Result<(), Declined> {
    let secret = SECRET_KEYS.iter().any(|k| k.eq_ignore_ascii_case(key));
    match value {
        _ if secret && *value != Value::Null => write_str(REDACTED, out),
        Value::String(s) if key.eq_ignore_ascii_case("path") => {
            write_str(&scan::redact(&redact_query(s)), out)
        }
        _ => write_value(value, out)?,
    }
    Ok(())
}

fn write_seq<'a>(
    items: impl Iterator<Item = &'a Value>,
    out: &mut Vec<u8>,
) -> Result<(), Declined> {
    out.push(b'[');
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_value(item, out)?;
    }
    out.push(b']');
    Ok(())
}

pub(super) fn write_str(s: &str, out: &mut Vec<u8>) {
    // Most strings of an input (header names and values, hosts, paths) need no escaping:
    // they are copied whole, which is a fraction of what serde_json's byte-by-byte escaper
    // costs per call. Anything else goes through serde_json's own escaping; writing into a
    // Vec cannot fail.
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        return;
    }
    let _ = serde_json::to_writer(&mut *out, s);
}

#[cfg(test)]
#[path = "render_tests.rs"]
mod tests;
