//! Re-signing S3's signed streaming bodies (`STREAMING-AWS4-HMAC-SHA256-PAYLOAD`, with or
//! without `-TRAILER`): the `aws-chunked` body of such a request carries a signature per
//! chunk, chained from the request's own signature. Once the proxy signs the request again
//! with the real key, every chunk signature must be computed again too, or the service
//! refuses the upload.
//!
//! Contract:
//! - Each chunk is `<hex size>;chunk-signature=<64 hex>\r\n<data>\r\n`, ending with a
//!   size-0 chunk; with `-TRAILER`, trailer lines and `x-amz-trailer-signature:<64 hex>`
//!   follow the size-0 chunk, then an empty line. What the sandbox signed is thrown away:
//!   each chunk is signed anew over its data with the previous new signature (the seed is the
//!   request's new signature), through `aws_sigv4::sign::v4::{sign_chunk, sign_trailer}`.
//! - The output has exactly the input's length (the size is copied as written and a
//!   signature is always 64 hex digits), so `Content-Length` and
//!   `x-amz-decoded-content-length` stay right.
//! - A chunk is held whole before it is forwarded (its signature precedes its data), so a
//!   chunk larger than [`MAX_CHUNK`] is refused, as is any framing error: a malformed body
//!   ends the upload with an error rather than being forwarded in part.

use bytes::{Bytes, BytesMut};
use std::time::SystemTime;

use aws_smithy_runtime_api::client::identity::Identity;

use super::aws::AwsKeys;

/// The largest chunk held (SDKs send 64 KiB to 1 MiB; S3 allows larger only in principle).
pub const MAX_CHUNK: usize = 16 * 1024 * 1024;
/// The longest chunk header or trailer line.
const MAX_LINE: usize = 4096;
/// The most trailer lines.
const MAX_TRAILERS: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    #[error("malformed aws-chunked body: {0}")]
    Malformed(&'static str),
    #[error("an aws-chunked chunk is larger than {MAX_CHUNK} bytes")]
    TooLarge,
    #[error("the aws-chunked body ended early")]
    Truncated,
    #[error("cannot sign a chunk: {0}")]
    Signing(String),
}

enum State {
    /// Reading a chunk header line.
    Header,
    /// Reading `size` bytes of data and the CRLF after them; `header` is the size as written.
    Data {
        size: usize,
        header: Bytes,
    },
    /// Reading trailer lines (the `-TRAILER` variant, after the size-0 chunk).
    Trailers {
        lines: Vec<Bytes>,
    },
    Done,
}

/// Re-signs one body as it streams; see the module documentation.
pub struct ChunkResigner {
    state: State,
    pending: BytesMut,
    running: String,
    trailer: bool,
    identity: Identity,
    region: String,
    service: String,
    time: SystemTime,
}

impl ChunkResigner {
    /// `seed` is the request's new signature; `time`, `region` and `service` are what it was
    /// signed with.
    pub fn new(
        seed: String,
        keys: &AwsKeys,
        region: &str,
        service: &str,
        time: SystemTime,
        trailer: bool,
    ) -> ChunkResigner {
        let identity = aws_credential_types::Credentials::new(
            keys.access_key_id.as_str(),
            keys.secret_access_key.expose(),
            keys.session_token.as_ref().map(|t| t.expose().to_owned()),
            None,
            "sandgate",
        )
        .into();
        ChunkResigner {
            state: State::Header,
            pending: BytesMut::new(),
            running: seed,
            trailer,
            identity,
            region: region.into(),
            service: service.into(),
            time,
        }
    }

    /// Takes the next bytes of the sandbox's body; returns what can be forwarded now.
    pub fn push(&mut self, input: &[u8]) -> Result<Bytes, ChunkError> {
        self.pending.extend_from_slice(input);
        let mut out = BytesMut::new();
        while self.step(&mut out)? {}
        Ok(out.freeze())
    }

    /// At the end of the sandbox's body: the body must be complete.
    pub fn finish(&mut self) -> Result<(), ChunkError> {
        match (&self.state, self.pending.is_empty()) {
            (State::Done, true) => Ok(()),
            (State::Done, false) => Err(ChunkError::Malformed("bytes after the final chunk")),
            _ => Err(ChunkError::Truncated),
        }
    }

    /// One step of the state machine; whether it made progress.
    fn step(&mut self, out: &mut BytesMut) -> Result<bool, ChunkError> {
        match std::mem::replace(&mut self.state, State::Done) {
            State::Header => {
                let Some(line) = self.line()? else {
                    self.state = State::Header;
                    return Ok(false);
                };
                let (size, header) = parse_header(&line)?;
                if size == 0 && self.trailer {
                    let signature = self.sign_chunk(&[])?;
                    write_header(out, &header, &signature);
                    self.state = State::Trailers { lines: Vec::new() };
                } else {
                    self.state = State::Data { size, header };
                }
                Ok(true)
            }
            State::Data { size, header } => {
                if self.pending.len() < size + 2 {
                    self.state = State::Data { size, header };
                    return Ok(false);
                }
                let data = self.pending.split_to(size).freeze();
                if &self.pending[..2] != b"\r\n" {
                    return Err(ChunkError::Malformed("chunk data not followed by CRLF"));
                }
                let _ = self.pending.split_to(2);
                let signature = self.sign_chunk(&data)?;
                write_header(out, &header, &signature);
                out.extend_from_slice(&data);
                out.extend_from_slice(b"\r\n");
                self.state = if size == 0 {
                    State::Done
                } else {
                    State::Header
                };
                Ok(true)
            }
            State::Trailers { mut lines } => {
                let Some(line) = self.line()? else {
                    self.state = State::Trailers { lines };
                    return Ok(false);
                };
                if !line.is_empty() {
                    if lines.len() == MAX_TRAILERS {
                        return Err(ChunkError::Malformed("too many trailer lines"));
                    }
                    lines.push(line);
                    self.state = State::Trailers { lines };
                    return Ok(true);
                }
                self.write_trailers(out, &lines)?;
                Ok(true)
            }
            State::Done => Ok(false),
        }
    }

    /// The next CRLF-terminated line, without its CRLF.
    fn line(&mut self) -> Result<Option<Bytes>, ChunkError> {
        let Some(end) = self.pending.windows(2).position(|w| w == b"\r\n") else {
            if self.pending.len() > MAX_LINE {
                return Err(ChunkError::Malformed("a line longer than 4096 bytes"));
            }
            return Ok(None);
        };
        if end > MAX_LINE {
            return Err(ChunkError::Malformed("a line longer than 4096 bytes"));
        }
        let line = self.pending.split_to(end).freeze();
        let _ = self.pending.split_to(2);
        Ok(Some(line))
    }

    /// The trailers as sent (but the signature), then their new signature and the end.
    fn write_trailers(&mut self, out: &mut BytesMut, lines: &[Bytes]) -> Result<(), ChunkError> {
        let mut headers = aws_smithy_runtime_api::http::Headers::new();
        let mut signed = false;
        for line in lines {
            let text = std::str::from_utf8(line)
                .map_err(|_| ChunkError::Malformed("a trailer line is not UTF-8"))?;
            let (name, value) = text
                .split_once(':')
                .ok_or(ChunkError::Malformed("a trailer line without ':'"))?;
            if name.trim().eq_ignore_ascii_case("x-amz-trailer-signature") {
                signed = true;
                continue;
            }
            let name = name.trim().to_ascii_lowercase();
            http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| ChunkError::Malformed("a trailer name is not a header name"))?;
            headers.append(name, value.trim().to_string());
            out.extend_from_slice(line);
            out.extend_from_slice(b"\r\n");
        }
        if !signed {
            return Err(ChunkError::Malformed("no x-amz-trailer-signature"));
        }
        let params = self.params()?;
        let signature = aws_sigv4::sign::v4::sign_trailer(&headers, &self.running, &params)
            .map_err(|e| ChunkError::Signing(e.to_string()))?
            .into_parts()
            .1;
        out.extend_from_slice(b"x-amz-trailer-signature:");
        out.extend_from_slice(signature.as_bytes());
        out.extend_from_slice(b"\r\n\r\n");
        self.running = signature;
        self.state = State::Done;
        Ok(())
    }

    fn sign_chunk(&mut self, data: &[u8]) -> Result<String, ChunkError> {
        let params = self.params()?;
        let chunk = Bytes::copy_from_slice(data);
        let signature = aws_sigv4::sign::v4::sign_chunk(&chunk, &self.running, &params)
            .map_err(|e| ChunkError::Signing(e.to_string()))?
            .into_parts()
            .1;
        self.running = signature.clone();
        Ok(signature)
    }

    fn params(&self) -> Result<aws_sigv4::sign::v4::SigningParams<'_, ()>, ChunkError> {
        aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&self.identity)
            .region(&self.region)
            .name(&self.service)
            .time(self.time)
            .settings(())
            .build()
            .map_err(|e| ChunkError::Signing(e.to_string()))
    }
}

/// `<hex size>;chunk-signature=<64 hex>`: the size and the size as written.
fn parse_header(line: &[u8]) -> Result<(usize, Bytes), ChunkError> {
    const MARK: &[u8] = b";chunk-signature=";
    let at = line
        .windows(MARK.len())
        .position(|w| w == MARK)
        .ok_or(ChunkError::Malformed(
            "a chunk header without chunk-signature",
        ))?;
    let (size_text, rest) = line.split_at(at);
    let signature = &rest[MARK.len()..];
    if signature.len() != 64 || !signature.iter().all(u8::is_ascii_hexdigit) {
        return Err(ChunkError::Malformed(
            "a chunk signature is not 64 hex digits",
        ));
    }
    if size_text.is_empty() || size_text.len() > 16 || !size_text.iter().all(u8::is_ascii_hexdigit)
    {
        return Err(ChunkError::Malformed("a chunk size is not hexadecimal"));
    }
    let text = std::str::from_utf8(size_text).map_err(|_| ChunkError::Malformed("size"))?;
    let size = usize::from_str_radix(text, 16).map_err(|_| ChunkError::TooLarge)?;
    if size > MAX_CHUNK {
        return Err(ChunkError::TooLarge);
    }
    Ok((size, Bytes::copy_from_slice(size_text)))
}

fn write_header(out: &mut BytesMut, size: &[u8], signature: &str) {
    out.extend_from_slice(size);
    out.extend_from_slice(b";chunk-signature=");
    out.extend_from_slice(signature.as_bytes());
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
#[path = "aws_chunked_tests.rs"]
mod tests;
