//! Removing applied secrets from what an upstream sends back to the sandbox.
//!
//! An upstream may reflect what it received (an echo endpoint, an error message quoting the
//! request, a debug header). Whatever carried a secret to it must not hand that secret to the
//! sandbox, in any of the forms sandgate or a server would write it:
//! - the secret itself;
//! - percent-encoded (as sandgate writes a `query` credential, upper- and lower-case hex, and
//!   form encoding with `+` for spaces);
//! - base64 (standard and URL-safe, padded and not);
//! - for a `basic` credential, the exact `base64(username:secret)` sandgate put on the request.
//!
//! Response header values and trailers are always scrubbed (a header whose name carries a
//! form is dropped). Bodies are scrubbed only for credentials with `scrub_response_body`, for
//! text content types, as a stream: at most `longest form - 1` bytes are held back between
//! chunks, so memory stays bounded whatever the body's size. A form that is split across a
//! larger encoding (base64 of a document containing the secret, at another alignment) is not
//! recognised; that is the limit of matching known forms.

use aho_corasick::{packed, AhoCorasick, AhoCorasickKind, MatchKind};
use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::Secret;

/// What a secret is replaced with.
pub const REDACTED: &[u8] = b"[redacted by sandgate]";

/// Characters left as they are when a secret goes into a query string (RFC 3986 unreserved).
pub const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Every known form of one credential's secret, compiled once per credential version.
pub struct Scrubber {
    matcher: Finder,
    longest: usize,
    /// Forms in lower case, for header names (which are lower case on the wire).
    lower_forms: Vec<String>,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scrubber([redacted])")
    }
}

impl Scrubber {
    /// `basic_username` is set for a `basic` credential: its exact encoding is a form too.
    pub fn new(secret: &Secret, basic_username: Option<&str>) -> Scrubber {
        Scrubber::of(&[secret.expose()], basic_username)
    }

    /// Every form of each of `secrets` (a credential made of several values, such as an AWS
    /// key: its id, secret and session token).
    pub fn of(secrets: &[&str], basic_username: Option<&str>) -> Scrubber {
        let mut forms: Vec<String> = secrets
            .iter()
            .flat_map(|secret| self::forms(secret, basic_username))
            .collect();
        forms.sort();
        forms.dedup();
        let longest = forms.iter().map(String::len).max().unwrap_or(1);
        let matcher = Finder::new(&forms);
        let lower_forms = forms.iter().map(|f| f.to_ascii_lowercase()).collect();
        Scrubber {
            matcher,
            longest,
            lower_forms,
        }
    }

    /// `bytes` with every form replaced, or `None` when there was none.
    pub fn scrub(&self, bytes: &[u8]) -> Option<Vec<u8>> {
        let matches = self.matcher.matches(bytes);
        if matches.is_empty() {
            return None;
        }
        let mut out = Vec::with_capacity(bytes.len());
        let mut last = 0;
        for (start, end) in matches {
            out.extend_from_slice(&bytes[last..start]);
            out.extend_from_slice(REDACTED);
            last = end;
        }
        out.extend_from_slice(&bytes[last..]);
        Some(out)
    }

    fn names_a_form(&self, name: &str) -> bool {
        self.lower_forms.iter().any(|f| name.contains(f.as_str()))
    }
}

/// Leftmost-longest search for a handful of literals: a SIMD packed searcher (Teddy) where
/// the CPU has one, else an Aho-Corasick DFA. Teddy keeps the scan fast whatever the forms'
/// first bytes are; the automaton's byte prefilters are only as good as those bytes are rare
/// in the body (measured with `cargo bench --bench scrub`).
enum Finder {
    Packed(packed::Searcher),
    Automaton(AhoCorasick),
}

impl Finder {
    fn new(forms: &[String]) -> Finder {
        let packed = packed::Config::new()
            .match_kind(packed::MatchKind::LeftmostLongest)
            .builder()
            .extend(forms)
            .build();
        match packed {
            Some(searcher) => Finder::Packed(searcher),
            None => Finder::Automaton(
                AhoCorasick::builder()
                    .match_kind(MatchKind::LeftmostLongest)
                    .kind(Some(AhoCorasickKind::DFA))
                    .build(forms)
                    .expect("literal patterns build"),
            ),
        }
    }

    /// Non-overlapping `(start, end)` of every match, in order.
    fn matches(&self, haystack: &[u8]) -> Vec<(usize, usize)> {
        match self {
            Finder::Packed(s) => s
                .find_iter(haystack)
                .map(|m| (m.start(), m.end()))
                .collect(),
            Finder::Automaton(a) => a
                .find_iter(haystack)
                .map(|m| (m.start(), m.end()))
                .collect(),
        }
    }
}

fn forms(secret: &str, basic_username: Option<&str>) -> Vec<String> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let upper = utf8_percent_encode(secret, QUERY_VALUE).to_string();
    let mut forms = vec![
        secret.to_string(),
        lower_hex_escapes(&upper),
        utf8_percent_encode(secret, QUERY_VALUE)
            .to_string()
            .replace("%20", "+"),
        upper,
    ];
    for engine in [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD] {
        forms.push(engine.encode(secret));
    }
    if let Some(username) = basic_username {
        let pair = format!("{username}:{secret}");
        forms.push(STANDARD.encode(&pair));
        forms.push(STANDARD_NO_PAD.encode(&pair));
    }
    forms.retain(|f| !f.is_empty());
    forms.sort();
    forms.dedup();
    forms
}

/// `%2F` → `%2f` (servers write either).
fn lower_hex_escapes(encoded: &str) -> String {
    let mut out = String::with_capacity(encoded.len());
    let mut chars = encoded.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '%' {
            for _ in 0..2 {
                if let Some(h) = chars.next() {
                    out.push(h.to_ascii_lowercase());
                }
            }
        }
    }
    out
}

/// Scrubs header values (and drops headers whose name carries a form) in place.
pub fn scrub_headers(headers: &mut HeaderMap, scrubbers: &[std::sync::Arc<Scrubber>]) {
    if scrubbers.is_empty() || headers.is_empty() {
        return;
    }
    let names: Vec<http::HeaderName> = headers.keys().cloned().collect();
    for name in names {
        if scrubbers.iter().any(|s| s.names_a_form(name.as_str())) {
            headers.remove(&name);
            continue;
        }
        let values: Vec<HeaderValue> = headers.get_all(&name).iter().cloned().collect();
        let mut changed = false;
        let scrubbed: Vec<HeaderValue> = values
            .into_iter()
            .map(|value| {
                let mut bytes = value.as_bytes().to_vec();
                for scrubber in scrubbers {
                    if let Some(clean) = scrubber.scrub(&bytes) {
                        bytes = clean;
                        changed = true;
                    }
                }
                HeaderValue::from_bytes(&bytes).unwrap_or_else(|_| HeaderValue::from_static(""))
            })
            .collect();
        if changed {
            headers.remove(&name);
            for value in scrubbed {
                headers.append(name.clone(), value);
            }
        }
    }
}

/// A streaming scrubber over body chunks: a pipeline of one stage per credential, each
/// holding back at most its longest form minus one byte.
pub struct StreamScrub {
    stages: Vec<(std::sync::Arc<Scrubber>, Vec<u8>)>,
}

impl StreamScrub {
    pub fn new(scrubbers: Vec<std::sync::Arc<Scrubber>>) -> StreamScrub {
        StreamScrub {
            stages: scrubbers.into_iter().map(|s| (s, Vec::new())).collect(),
        }
    }

    /// What can be passed on after `chunk`.
    pub fn push(&mut self, chunk: &[u8]) -> Bytes {
        let mut data = chunk.to_vec();
        for (scrubber, carry) in &mut self.stages {
            data = push_stage(scrubber, carry, &data);
        }
        Bytes::from(data)
    }

    /// The rest, at the end of the body.
    pub fn finish(&mut self) -> Bytes {
        let mut data = Vec::new();
        for (scrubber, carry) in &mut self.stages {
            let mut input = std::mem::take(carry);
            input.extend_from_slice(&data);
            data = scrubber.scrub(&input).unwrap_or(input);
        }
        Bytes::from(data)
    }

    /// Bytes held back right now (bounded by the longest forms).
    pub fn held(&self) -> usize {
        self.stages.iter().map(|(_, c)| c.len()).sum()
    }
}

fn push_stage(scrubber: &Scrubber, carry: &mut Vec<u8>, chunk: &[u8]) -> Vec<u8> {
    let mut buf = std::mem::take(carry);
    buf.extend_from_slice(chunk);
    // A match starting before `safe` is complete in `buf`; one starting later may not be.
    let safe = buf.len().saturating_sub(scrubber.longest - 1);
    let mut out = Vec::with_capacity(buf.len());
    let mut last = 0;
    for (start, end) in scrubber.matcher.matches(&buf) {
        if start >= safe {
            break;
        }
        out.extend_from_slice(&buf[last..start]);
        out.extend_from_slice(REDACTED);
        last = end;
    }
    let cut = safe.max(last);
    out.extend_from_slice(&buf[last..cut]);
    carry.extend_from_slice(&buf[cut..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn scrubber() -> Arc<Scrubber> {
        Arc::new(Scrubber::new(&Secret::new("s3cr/t v@l"), Some("bot")))
    }

    #[test]
    fn every_form_is_replaced() {
        use base64::engine::general_purpose::STANDARD;
        let s = scrubber();
        for form in [
            "s3cr/t v@l".to_string(),
            "s3cr%2Ft%20v%40l".into(),
            "s3cr%2ft%20v%40l".into(),
            "s3cr%2Ft+v%40l".into(),
            STANDARD.encode("s3cr/t v@l"),
            STANDARD.encode("bot:s3cr/t v@l"),
        ] {
            let text = format!("before {form} after");
            let clean = s.scrub(text.as_bytes()).expect(&form);
            assert_eq!(clean, b"before [redacted by sandgate] after", "{form}");
        }
        assert!(s.scrub(b"nothing").is_none());
    }

    #[test]
    fn streaming_finds_forms_split_across_chunks_with_bounded_carry() {
        let s = scrubber();
        let body = "xx s3cr/t v@l yy s3cr%2Ft%20v%40l zz".repeat(50);
        for size in [1, 2, 3, 7, 64] {
            let mut stream = StreamScrub::new(vec![s.clone()]);
            let mut out = Vec::new();
            for chunk in body.as_bytes().chunks(size) {
                out.extend_from_slice(&stream.push(chunk));
                assert!(stream.held() < s.longest);
            }
            out.extend_from_slice(&stream.finish());
            let text = String::from_utf8(out).unwrap();
            assert!(!text.contains("s3cr"), "chunk {size}");
            assert_eq!(text.matches("[redacted by sandgate]").count(), 100);
        }
    }

    #[test]
    fn headers_are_scrubbed_and_names_carrying_a_form_dropped() {
        let s = scrubber();
        let mut headers = HeaderMap::new();
        headers.insert("x-echo", HeaderValue::from_static("token=s3cr%2Ft%20v%40l"));
        headers.insert("x-plain", HeaderValue::from_static("fine"));
        scrub_headers(&mut headers, &[s]);
        assert_eq!(headers["x-echo"], "token=[redacted by sandgate]");
        assert_eq!(headers["x-plain"], "fine");
    }

    proptest::proptest! {
        #[test]
        fn streaming_equals_scrubbing_the_whole_body(
            parts in proptest::collection::vec("(s3cr/t v@l|s3cr%2Ft%20v%40l|s3c|r/t|x|yy| )", 0..40),
            sizes in proptest::collection::vec(1usize..16, 1..8),
        ) {
            let s = scrubber();
            let body = parts.concat();
            let whole = s.scrub(body.as_bytes()).unwrap_or_else(|| body.as_bytes().to_vec());
            let mut stream = StreamScrub::new(vec![s.clone()]);
            let mut out = Vec::new();
            let mut rest = body.as_bytes();
            let mut i = 0;
            while !rest.is_empty() {
                let n = sizes[i % sizes.len()].min(rest.len());
                out.extend_from_slice(&stream.push(&rest[..n]));
                rest = &rest[n..];
                i += 1;
            }
            out.extend_from_slice(&stream.finish());
            proptest::prop_assert_eq!(out, whole);
        }
    }
}
