//! The protobuf subset of Prime's `command_session/command_session.proto` (as published in
//! `prime-sandboxes` 0.5.1's `_proto/command_session`), encoded and decoded by hand: no
//! protoc or generated code at build time.
//!
//! Contract:
//! - [`Writer`] and [`Reader`] are the wire format (varints, length-delimited fields,
//!   zigzag `sint32`); the messages sandgate sends ([`start_request`],
//!   [`send_signal_request`]) and reads ([`read_event`]) are built on them. The fake Prime
//!   in the test tree uses the same primitives for the other direction, so the official
//!   SDK's own protobuf runtime checks both sides.
//! - Reading never panics on provider bytes: a malformed message is an error, unknown
//!   fields are skipped (a newer server may add some).

use std::collections::BTreeMap;

/// Wire types (protobuf encoding).
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// `command_session.Signal.SIGNAL_SIGKILL`.
pub const SIGNAL_SIGKILL: u64 = 9;
/// `command_session.Signal.SIGNAL_SIGTERM`.
pub const SIGNAL_SIGTERM: u64 = 15;

/// A malformed protobuf message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a malformed protobuf message: {0}")]
pub struct ProtoError(pub &'static str);

/// Appends fields to a message.
#[derive(Debug, Default, Clone)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    pub fn new() -> Writer {
        Writer::default()
    }

    pub fn finish(self) -> Vec<u8> {
        self.buf
    }

    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    fn key(&mut self, field: u32, wire: u8) {
        self.varint(((field as u64) << 3) | wire as u64);
    }

    pub fn uint(&mut self, field: u32, v: u64) -> &mut Writer {
        self.key(field, VARINT);
        self.varint(v);
        self
    }

    pub fn sint32(&mut self, field: u32, v: i32) -> &mut Writer {
        self.uint(field, ((v << 1) ^ (v >> 31)) as u32 as u64)
    }

    pub fn bool(&mut self, field: u32, v: bool) -> &mut Writer {
        self.uint(field, v as u64)
    }

    pub fn bytes(&mut self, field: u32, v: &[u8]) -> &mut Writer {
        self.key(field, LEN);
        self.varint(v.len() as u64);
        self.buf.extend_from_slice(v);
        self
    }

    pub fn string(&mut self, field: u32, v: &str) -> &mut Writer {
        self.bytes(field, v.as_bytes())
    }

    /// An embedded message (also how a `map` entry and a oneof's message are written).
    pub fn message(&mut self, field: u32, v: &Writer) -> &mut Writer {
        self.bytes(field, &v.buf)
    }
}

/// One field of a message as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    /// A fixed-width field (skipped by every message here).
    Fixed,
}

impl<'a> Value<'a> {
    pub fn as_u64(self) -> u64 {
        match self {
            Value::Varint(v) => v,
            _ => 0,
        }
    }

    pub fn as_sint32(self) -> i32 {
        let v = self.as_u64() as u32;
        ((v >> 1) as i32) ^ -((v & 1) as i32)
    }

    pub fn as_bytes(self) -> &'a [u8] {
        match self {
            Value::Bytes(b) => b,
            _ => &[],
        }
    }

    pub fn as_str(self) -> String {
        String::from_utf8_lossy(self.as_bytes()).into_owned()
    }
}

/// Walks the fields of one message.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf }
    }

    fn varint(&mut self) -> Result<u64, ProtoError> {
        let mut out = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self
                .buf
                .split_first()
                .ok_or(ProtoError("a truncated varint"))?;
            self.buf = rest;
            out |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(out);
            }
        }
        Err(ProtoError("a varint over 10 bytes"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.buf.len() < n {
            return Err(ProtoError("a field longer than its message"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    /// The next field (number and value), or `None` at the end of the message.
    pub fn next_field(&mut self) -> Result<Option<(u32, Value<'a>)>, ProtoError> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = u32::try_from(key >> 3).map_err(|_| ProtoError("a field number too large"))?;
        let value = match (key & 7) as u8 {
            VARINT => Value::Varint(self.varint()?),
            LEN => {
                let len = usize::try_from(self.varint()?)
                    .map_err(|_| ProtoError("a length too large"))?;
                Value::Bytes(self.take(len)?)
            }
            FIXED64 => {
                self.take(8)?;
                Value::Fixed
            }
            FIXED32 => {
                self.take(4)?;
                Value::Fixed
            }
            _ => return Err(ProtoError("a group or an unknown wire type")),
        };
        Ok(Some((field, value)))
    }
}

/// `CommandSpec {cmd = 1; args = 2; envs = 3 (map); cwd = 4}` inside `StartRequest {command
/// = 1; session_uuid = 5}`: the program runs as given (no shell in between).
pub fn start_request(
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&str>,
    session_uuid: &str,
) -> Vec<u8> {
    let mut spec = Writer::new();
    if let Some((program, args)) = argv.split_first() {
        spec.string(1, program);
        for arg in args {
            spec.string(2, arg);
        }
    }
    for (key, value) in env {
        let mut entry = Writer::new();
        entry.string(1, key).string(2, value);
        spec.message(3, &entry);
    }
    if let Some(cwd) = cwd {
        spec.string(4, cwd);
    }
    let mut request = Writer::new();
    request.message(1, &spec).string(5, session_uuid);
    request.finish()
}

/// `SendSignalRequest {session = 1 (CommandSessionSelector {session_uuid = 3}); signal = 2;
/// signal_uuid = 3}`.
pub fn send_signal_request(session_uuid: &str, signal: u64, signal_uuid: &str) -> Vec<u8> {
    let mut selector = Writer::new();
    selector.string(3, session_uuid);
    let mut request = Writer::new();
    request
        .message(1, &selector)
        .uint(2, signal)
        .string(3, signal_uuid);
    request.finish()
}

/// One `CommandSessionEvent` of a `Start` stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Started {
        pid: u32,
    },
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// `EndEvent {exit_code = 1 (sint32); exited = 2; status = 3; error = 4}`.
    End {
        exit_code: i32,
        exited: bool,
        status: String,
        error: Option<String>,
    },
    KeepAlive,
    /// An event this subset does not know (or a response without one).
    Other,
}

/// The event of one `StartResponse {event = 1}` message.
pub fn read_event(message: &[u8]) -> Result<Event, ProtoError> {
    let mut response = Reader::new(message);
    let mut event = Event::Other;
    while let Some((field, value)) = response.next_field()? {
        if field == 1 {
            event = read_session_event(value.as_bytes())?;
        }
    }
    Ok(event)
}

fn read_session_event(bytes: &[u8]) -> Result<Event, ProtoError> {
    let mut reader = Reader::new(bytes);
    let mut event = Event::Other;
    while let Some((field, value)) = reader.next_field()? {
        let inner = value.as_bytes();
        event = match field {
            1 => {
                let mut pid = 0;
                let mut r = Reader::new(inner);
                while let Some((f, v)) = r.next_field()? {
                    if f == 1 {
                        pid = v.as_u64() as u32;
                    }
                }
                Event::Started { pid }
            }
            2 => {
                let mut out = Event::Other;
                let mut r = Reader::new(inner);
                while let Some((f, v)) = r.next_field()? {
                    out = match f {
                        // A PTY's output is the terminal's: stdout.
                        1 | 3 => Event::Stdout(v.as_bytes().to_vec()),
                        2 => Event::Stderr(v.as_bytes().to_vec()),
                        _ => out,
                    };
                }
                out
            }
            3 => {
                let (mut exit_code, mut exited, mut status, mut error) =
                    (0, false, String::new(), None);
                let mut r = Reader::new(inner);
                while let Some((f, v)) = r.next_field()? {
                    match f {
                        1 => exit_code = v.as_sint32(),
                        2 => exited = v.as_u64() != 0,
                        3 => status = v.as_str(),
                        4 => error = Some(v.as_str()),
                        _ => {}
                    }
                }
                Event::End {
                    exit_code,
                    exited,
                    status,
                    error,
                }
            }
            4 => Event::KeepAlive,
            _ => event,
        };
    }
    Ok(event)
}
