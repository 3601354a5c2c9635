//! The Connect protocol's streaming envelopes with the JSON codec, as E2B's envd speaks
//! them (`application/connect+json`): each message is a 5-byte prefix (one flags byte,
//! then the payload length as a big-endian u32) and the payload. Flag `0x02` marks the
//! end-of-stream message, whose JSON may carry an `error`; flag `0x01` a compressed
//! message, which neither side here sends or accepts.
//!
//! Both directions use this module: sandgate's E2B adapter (client: it envelopes the
//! request and decodes envd's stream) and the E2B facade (server: it decodes the request
//! and envelopes the stream it answers).

use bytes::{Buf, Bytes, BytesMut};
use serde_json::{json, Value};

/// Flag of the end-of-stream message.
pub const END_STREAM: u8 = 0x02;
/// Flag of a compressed message.
pub const COMPRESSED: u8 = 0x01;

/// The largest message accepted (envd's output chunks are far smaller).
pub const MAX_MESSAGE: usize = 16 << 20;

/// One message, enveloped with `flags`.
pub fn envelope_with(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + payload.len());
    out.extend_from_slice(&[flags]);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out.freeze()
}

/// One request message, enveloped.
pub fn envelope(payload: &[u8]) -> Bytes {
    envelope_with(0, payload)
}

/// One JSON message of a stream, enveloped.
pub fn message(value: &Value) -> Bytes {
    envelope_with(0, &serde_json::to_vec(value).unwrap_or_default())
}

/// The end-of-stream message: `{}` for success, `{"error": {code, message}}` otherwise.
pub fn end_stream(error: Option<&RpcError>) -> Bytes {
    let body = match error {
        Some(e) => json!({"error": {"code": e.code, "message": e.message}}),
        None => json!({}),
    };
    envelope_with(END_STREAM, &serde_json::to_vec(&body).unwrap_or_default())
}

/// A Connect error: one of the protocol's codes and a message for humans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    pub code: &'static str,
    pub message: String,
}

impl RpcError {
    pub fn new(code: &'static str, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }

    /// The HTTP status a unary call answers this error with (the Connect protocol's table).
    pub fn http_status(&self) -> u16 {
        match self.code {
            "canceled" => 499,
            "invalid_argument" | "failed_precondition" | "out_of_range" => 400,
            "deadline_exceeded" => 504,
            "not_found" => 404,
            "already_exists" | "aborted" => 409,
            "permission_denied" => 403,
            "resource_exhausted" => 429,
            "unimplemented" => 501,
            "unavailable" => 503,
            "unauthenticated" => 401,
            _ => 500,
        }
    }

    /// The unary error body: `{code, message}`.
    pub fn body(&self) -> Value {
        json!({"code": self.code, "message": self.message})
    }
}

/// The single request message of a server-stream call (what `process.Process/Start` and
/// `Process/Connect` receive): a whole, uncompressed envelope and nothing after it.
pub fn single_message(body: &[u8]) -> Result<Value, RpcError> {
    let mut decoder = Decoder::default();
    decoder.push(body);
    let frame = match decoder.next_frame() {
        Ok(Some(frame)) => frame,
        Ok(None) | Err(DecodeError::Truncated) => {
            return Err(RpcError::new(
                "invalid_argument",
                "a truncated Connect envelope",
            ))
        }
        Err(e) => return Err(RpcError::new("resource_exhausted", e.to_string())),
    };
    if frame.flags & COMPRESSED != 0 {
        return Err(RpcError::new(
            "internal",
            "compressed Connect messages are not accepted",
        ));
    }
    if decoder.finish().is_err() || decoder.next_frame() != Ok(None) {
        return Err(RpcError::new(
            "invalid_argument",
            "a server-stream request holds exactly one message",
        ));
    }
    serde_json::from_slice(&frame.payload)
        .map_err(|e| RpcError::new("invalid_argument", format!("unmarshal message: {e}")))
}

/// One message out of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub flags: u8,
    pub payload: Bytes,
}

impl Frame {
    pub fn is_end(&self) -> bool {
        self.flags & END_STREAM != 0
    }
}

/// Splits a byte stream into messages, whatever the chunking.
#[derive(Default)]
pub struct Decoder {
    buffer: BytesMut,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("a Connect message of {0} bytes is over the {MAX_MESSAGE}-byte limit")]
    TooLarge(usize),
    #[error("the stream ended inside a Connect message")]
    Truncated,
}

impl Decoder {
    pub fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// The next whole message, if one is buffered.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, DecodeError> {
        if self.buffer.len() < 5 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
            self.buffer[4],
        ]) as usize;
        if len > MAX_MESSAGE {
            return Err(DecodeError::TooLarge(len));
        }
        if self.buffer.len() < 5 + len {
            return Ok(None);
        }
        let flags = self.buffer[0];
        self.buffer.advance(5);
        let payload = self.buffer.split_to(len).freeze();
        Ok(Some(Frame { flags, payload }))
    }

    /// At the end of the byte stream: an error if a message was cut.
    pub fn finish(&self) -> Result<(), DecodeError> {
        if self.buffer.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Truncated)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_come_out_whatever_the_chunking() {
        let mut stream = envelope(br#"{"a":1}"#).to_vec();
        stream.extend_from_slice(&[END_STREAM, 0, 0, 0, 2, b'{', b'}']);
        for size in [1, 2, 3, 7, 100] {
            let mut decoder = Decoder::default();
            let mut frames = Vec::new();
            for chunk in stream.chunks(size) {
                decoder.push(chunk);
                while let Some(frame) = decoder.next_frame().unwrap() {
                    frames.push(frame);
                }
            }
            decoder.finish().unwrap();
            assert_eq!(frames.len(), 2);
            assert_eq!(&frames[0].payload[..], br#"{"a":1}"#);
            assert!(!frames[0].is_end());
            assert!(frames[1].is_end());
        }
    }

    #[test]
    fn oversized_and_truncated_messages_are_errors() {
        let mut decoder = Decoder::default();
        decoder.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(
            decoder.next_frame(),
            Err(DecodeError::TooLarge(_))
        ));
        let mut decoder = Decoder::default();
        decoder.push(&[0, 0, 0, 0, 9, b'x']);
        assert_eq!(decoder.next_frame(), Ok(None));
        assert_eq!(decoder.finish(), Err(DecodeError::Truncated));
    }

    #[test]
    fn a_server_stream_request_is_exactly_one_message() {
        assert_eq!(
            single_message(&envelope(br#"{"a":1}"#)).unwrap(),
            json!({"a": 1})
        );
        let mut two = envelope(b"{}").to_vec();
        two.extend_from_slice(&envelope(b"{}"));
        assert_eq!(single_message(&two).unwrap_err().code, "invalid_argument");
        assert_eq!(
            single_message(&[0, 0]).unwrap_err().code,
            "invalid_argument"
        );
        assert_eq!(
            single_message(&envelope_with(COMPRESSED, b"{}"))
                .unwrap_err()
                .code,
            "internal"
        );
        assert_eq!(
            single_message(&envelope(b"not json")).unwrap_err().code,
            "invalid_argument"
        );
    }

    #[test]
    fn the_end_of_stream_carries_the_error() {
        let mut decoder = Decoder::default();
        decoder.push(&end_stream(Some(&RpcError::new(
            "deadline_exceeded",
            "late",
        ))));
        let frame = decoder.next_frame().unwrap().unwrap();
        assert!(frame.is_end());
        let body: Value = serde_json::from_slice(&frame.payload).unwrap();
        assert_eq!(body["error"]["code"], "deadline_exceeded");
        assert_eq!(RpcError::new("not_found", "").http_status(), 404);
    }

    proptest::proptest! {
        #[test]
        fn any_request_body_is_an_answer_or_an_error(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let _ = single_message(&bytes);
        }


        #[test]
        fn any_bytes_decode_without_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let mut decoder = Decoder::default();
            decoder.push(&bytes);
            while let Ok(Some(_)) = decoder.next_frame() {}
            let _ = decoder.finish();
        }
    }
}
