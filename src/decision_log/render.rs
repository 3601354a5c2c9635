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

use std::sync::{Arc, OnceLock};

use regorus::{Rc, Value};

use super::{redact_query, REDACTED, SECRET_KEYS};
use crate::base::scan;

/// The input has a shape only the general path redacts correctly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Declined;

/// Appends `input` as redacted JSON to `out`; on [`Declined`], `out` may hold a partial
/// document and must be truncated by the caller. A top-level object that one of `shared`
/// holds is written from that one's rendering ([`SharedObject`]).
pub(super) fn write_input(
    input: &Value,
    full_argv: bool,
    out: &mut Vec<u8>,
    shared: &[Option<Arc<SharedObject>>],
) -> Result<(), Declined> {
    if !full_argv {
        if let Value::Object(fields) = input {
            if fields.get(&Value::from("exec")).is_some() {
                return Err(Declined);
            }
        }
    }
    if shared.iter().all(Option::is_none) {
        return write_value(input, out);
    }
    write_object(input, out, &mut |key, value, out| {
        let known = match value {
            Value::Object(_) if !is_secret(key) => shared.iter().flatten().find(|s| s.holds(value)),
            _ => None,
        };
        match known {
            Some(object) => object.write(out),
            None => write_field(key, value, out),
        }
    })
}

/// A top-level object of policy inputs that many records share by reference (a tunnel's
/// sandbox part and its vetted destination, built once per tunnel), with its loggable JSON
/// rendered once, by the first record written that holds it, and freed with its last
/// holder: the tunnel, or a record still queued for the writer when the tunnel closed.
///
/// Why it is the tunnel's and not a renderer's memo: these objects are two thirds of an
/// egress input's bytes, and rendering them again for every request was ~6k instructions
/// of the ~18.5k a record cost its proxy worker (callgrind, keep-alive h1). A memo kept by
/// whoever renders (the writer thread's, until this) must hold the objects it knows to tell
/// a live one from a freed address reused, so it kept closed tunnels' objects alive among
/// the workers' pages, and could not be shared by the workers, which render records
/// themselves when nothing but the ring reads them. Held by the tunnel, a rendering lives exactly as long as its object.
///
/// An object's rendering does not depend on where it appears, once its key is known not to
/// be one whose value is redacted whole (checked before it is asked).
pub struct SharedObject {
    value: Value,
    json: OnceLock<Result<Box<[u8]>, Declined>>,
}

impl std::fmt::Debug for SharedObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedObject")
            .field("rendered", &self.json.get().is_some())
            .finish_non_exhaustive()
    }
}

impl SharedObject {
    pub fn new(value: Value) -> Arc<SharedObject> {
        Arc::new(SharedObject {
            value,
            json: OnceLock::new(),
        })
    }

    /// The object, to put into an input (a reference count, not a copy: that is what
    /// [`SharedObject::holds`] recognises).
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// Whether `value` is this very object (identity, not equality: an equal object built
    /// apart is written on its own).
    fn holds(&self, value: &Value) -> bool {
        match (&self.value, value) {
            (Value::Object(mine), Value::Object(theirs)) => Rc::ptr_eq(mine, theirs),
            _ => false,
        }
    }

    fn write(&self, out: &mut Vec<u8>) -> Result<(), Declined> {
        let json = self.json.get_or_init(|| {
            let mut json = Vec::new();
            write_value(&self.value, &mut json).map(|()| json.into_boxed_slice())
        });
        out.extend_from_slice(json.as_ref().map_err(|&d| d)?);
        Ok(())
    }
}

fn write_value(value: &Value, out: &mut Vec<u8>) -> Result<(), Declined> {
    match value {
        Value::String(s) => write_text(s, out),
        Value::Array(items) => write_seq(items.iter(), out)?,
        Value::Set(items) => write_seq(items.iter_sorted(), out)?,
        Value::Object(_) => write_object(value, out, &mut write_field)?,
        // Null, booleans, numbers and undefined: as the engine's own serializer writes them.
        other => serde_json::to_writer(&mut *out, other).map_err(|_| Declined)?,
    }
    Ok(())
}

/// How an object's member value is written, given its key.
type FieldWriter<'a> = dyn FnMut(&str, &Value, &mut Vec<u8>) -> Result<(), Declined> + 'a;

/// An object: its keys checked and written, each value by `field`.
fn write_object(
    object: &Value,
    out: &mut Vec<u8>,
    field: &mut FieldWriter<'_>,
) -> Result<(), Declined> {
    let Value::Object(fields) = object else {
        return write_value(object, out);
    };
    out.push(b'{');
    for (i, (key, value)) in fields.iter_sorted().enumerate() {
        let Value::String(key) = key else {
            return Err(Declined);
        };
        if class_of(key) & MAY_HOLD_PLACEHOLDER != 0 && scan::mentions_placeholder(key.as_bytes()) {
            return Err(Declined);
        }
        if i > 0 {
            out.push(b',');
        }
        write_str(key, out);
        out.push(b':');
        field(key, value, out)?;
    }
    out.push(b'}');
    Ok(())
}

fn is_secret(key: &str) -> bool {
    SECRET_KEYS.iter().any(|k| k.eq_ignore_ascii_case(key))
}

/// An object's value under `key`, with the key's own redaction rule.
fn write_field(key: &str, value: &Value, out: &mut Vec<u8>) -> Result<(), Declined> {
    match value {
        _ if *value != Value::Null && is_secret(key) => write_str(REDACTED, out),
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

/// A string value: [`scan::redact`]ed when it may hold a placeholder, then written.
fn write_text(s: &str, out: &mut Vec<u8>) {
    let class = class_of(s);
    if class & MAY_HOLD_PLACEHOLDER != 0 {
        write_str(&scan::redact(s), out);
    } else {
        write_classified(s, class, out);
    }
}

/// A byte JSON escapes inside a string: a control character, `"` or `\`.
const ESCAPED: u8 = 1;
/// A byte without which no placeholder can be found: `_` ends every prefix, `%` starts
/// every percent-encoded form ([`scan::mentions_placeholder`] looks no further).
const MAY_HOLD_PLACEHOLDER: u8 = 2;

/// Each byte's classes, so one pass over a string answers both questions.
static CLASSES: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = ESCAPED;
        b += 1;
    }
    table[b'"' as usize] = ESCAPED;
    table[b'\\' as usize] = ESCAPED;
    table[b'_' as usize] = MAY_HOLD_PLACEHOLDER;
    table[b'%' as usize] = MAY_HOLD_PLACEHOLDER;
    table
};

/// The union of the classes of `s`'s bytes.
fn class_of(s: &str) -> u8 {
    s.bytes()
        .fold(0, |class, b| class | CLASSES[usize::from(b)])
}

/// Appends `s` as a JSON string.
pub(super) fn write_str(s: &str, out: &mut Vec<u8>) {
    write_classified(s, class_of(s), out);
}

fn write_classified(s: &str, class: u8, out: &mut Vec<u8>) {
    // Most strings of an input (header names and values, hosts, paths) need no escaping:
    // they are copied whole, which is a fraction of what serde_json's byte-by-byte escaper
    // costs per call. Anything else goes through serde_json's own escaping; writing into a
    // Vec cannot fail.
    if class & ESCAPED == 0 {
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
