//! The Connect protocol's streaming envelopes with the JSON codec, as E2B's envd speaks
//! them (`application/connect+json`): each message is a 5-byte prefix (one flags byte,
//! then the payload length as a big-endian u32) and the payload. Flag `0x02` marks the
//! end-of-stream message, whose JSON may carry an `error`.

use bytes::{Buf, Bytes, BytesMut};

/// Flag of the end-of-stream message.
pub const END_STREAM: u8 = 0x02;

/// The largest message accepted (envd's output chunks are far smaller).
pub const MAX_MESSAGE: usize = 16 << 20;

/// One request message, enveloped.
pub fn envelope(payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + payload.len());
    out.extend_from_slice(&[0]);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out.freeze()
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

    proptest::proptest! {
        #[test]
        fn any_bytes_decode_without_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let mut decoder = Decoder::default();
            decoder.push(&bytes);
            while let Ok(Some(_)) = decoder.next_frame() {}
            let _ = decoder.finish();
        }
    }
}
