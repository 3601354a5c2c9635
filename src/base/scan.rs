//! Finding credential placeholders wherever a sandbox can put bytes before the body.
//!
//! A placeholder is `sgph_` and 40 lower-case hex digits. The scanner looks for the prefix
//! without regard to case (host names, and many servers, do not care about case either) in
//! the raw bytes and in their percent-decoded forms (decoded repeatedly, so `%2573gph_` is
//! found too), and inside `Basic` credentials (base64 with or without padding, standard or
//! URL-safe alphabet). A prefix that is not followed by a well-formed placeholder is reported
//! as malformed: it is refused like any placeholder out of place, since it would otherwise
//! leave unresolved. Request bodies are not scanned (see the README).

use base64::Engine as _;

/// Every placeholder starts with this (then 40 hex characters of a keyed tag, see
/// `credentials::seal`), so a scanner finds them without knowing any key.
pub const PLACEHOLDER_PREFIX: &str = "sgph_";
/// Length of a whole placeholder: the prefix plus 40 hex characters.
pub const PLACEHOLDER_LEN: usize = PLACEHOLDER_PREFIX.len() + 40;

/// One placeholder found: the token in lower case, or `None` when the prefix is not followed
/// by a well-formed placeholder.
pub type Token = Option<String>;

/// How many rounds of percent-decoding are applied (each round may reveal another level).
const DECODE_ROUNDS: usize = 4;

/// Where each placeholder prefix starts in `bytes`, in any case. Every prefix ends in
/// `_`, which most header values, paths and keys never hold, so one memchr pass finds
/// the candidates and four bytes before each decide; the prefix cannot overlap itself, so
/// this is every occurrence. (A general matcher costs a search setup per call, and the
/// request path and the decision log call this for every header, key and value.)
fn prefix_starts(bytes: &[u8]) -> impl Iterator<Item = usize> + '_ {
    const HEAD: &[u8] = PLACEHOLDER_PREFIX
        .as_bytes()
        .split_last()
        .expect("non-empty")
        .1;
    memchr::memchr_iter(b'_', bytes).filter_map(|end| {
        let start = end.checked_sub(HEAD.len())?;
        bytes[start..end]
            .eq_ignore_ascii_case(HEAD)
            .then_some(start)
    })
}

/// Whether `bytes` holds a placeholder prefix, raw or percent-encoded.
pub fn mentions_placeholder(bytes: &[u8]) -> bool {
    if prefix_starts(bytes).next().is_some() {
        return true;
    }
    if !bytes.contains(&b'%') {
        return false;
    }
    let mut found = Vec::new();
    find(bytes, &mut found);
    !found.is_empty()
}

/// Appends every placeholder in `bytes` (raw and percent-decoded forms) to `out`.
pub fn find(bytes: &[u8], out: &mut Vec<Token>) {
    find_raw(bytes, out);
    if !bytes.contains(&b'%') {
        return;
    }
    let mut current = bytes.to_vec();
    for _ in 0..DECODE_ROUNDS {
        let decoded: Vec<u8> = percent_encoding::percent_decode(&current).collect();
        if decoded == current {
            break;
        }
        find_raw(&decoded, out);
        if !decoded.contains(&b'%') {
            break;
        }
        current = decoded;
    }
}

/// Like [`find`], and also inside a `Basic` credential (`value` is a whole header value).
pub fn find_with_basic(value: &[u8], out: &mut Vec<Token>) {
    find(value, out);
    if let Some(decoded) = decode_basic(value) {
        find(&decoded, out);
    }
}

fn find_raw(bytes: &[u8], out: &mut Vec<Token>) {
    // Percent-encoded forms are decoded before they get here.
    for start in prefix_starts(bytes) {
        let token = bytes
            .get(start..start + PLACEHOLDER_LEN)
            .filter(|t| {
                t[PLACEHOLDER_PREFIX.len()..]
                    .iter()
                    .all(u8::is_ascii_hexdigit)
            })
            .map(|t| String::from_utf8_lossy(t).to_ascii_lowercase());
        out.push(token);
    }
}

/// The bytes of an `Authorization: Basic …` value, decoded leniently: clients differ on
/// padding and some use the URL-safe alphabet.
pub fn decode_basic(value: &[u8]) -> Option<Vec<u8>> {
    use base64::engine::{general_purpose, DecodePaddingMode, GeneralPurposeConfig};
    let scheme = value.get(..6)?;
    if !scheme.eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let encoded = value[6..].trim_ascii();
    let lenient =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let standard = general_purpose::GeneralPurpose::new(&base64::alphabet::STANDARD, lenient);
    let url_safe = general_purpose::GeneralPurpose::new(&base64::alphabet::URL_SAFE, lenient);
    standard
        .decode(encoded)
        .or_else(|_| url_safe.decode(encoded))
        .ok()
}

/// `text` fit for a log line: when it carries a placeholder (in any form [`find`] knows),
/// the percent-decoded text with each placeholder cut to `sgph_[redacted]`.
pub fn redact(text: &str) -> std::borrow::Cow<'_, str> {
    if !mentions_placeholder(text.as_bytes()) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut decoded = text.to_string();
    for _ in 0..DECODE_ROUNDS {
        let next = percent_encoding::percent_decode_str(&decoded)
            .decode_utf8_lossy()
            .into_owned();
        if next == decoded {
            break;
        }
        decoded = next;
    }
    let mut out = String::with_capacity(decoded.len());
    let mut last = 0;
    let starts: Vec<usize> = prefix_starts(decoded.as_bytes()).collect();
    for start in starts {
        if start < last {
            continue;
        }
        out.push_str(&decoded[last..start]);
        out.push_str("sgph_[redacted]");
        let end = start + PLACEHOLDER_PREFIX.len();
        let tail = &decoded[end..];
        let len = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
            .unwrap_or(tail.len());
        last = end + len;
    }
    out.push_str(&decoded[last..]);
    std::borrow::Cow::Owned(out)
}

/// `name=value` pairs of a query string, each part percent-decoded (`+` as a space), with
/// the raw pair kept so it can be removed or kept as sent.
pub struct QueryPair<'a> {
    pub raw: &'a str,
    pub name: Vec<u8>,
    pub value: &'a str,
}

pub fn query_pairs(query: &str) -> impl Iterator<Item = QueryPair<'_>> {
    query.split('&').filter(|p| !p.is_empty()).map(|raw| {
        let (name, value) = raw.split_once('=').unwrap_or((raw, ""));
        let name = name.replace('+', " ");
        QueryPair {
            raw,
            name: percent_encoding::percent_decode_str(&name).collect(),
            value,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placeholder() -> String {
        format!("{PLACEHOLDER_PREFIX}{}", "ab12".repeat(10))
    }

    fn tokens(bytes: &[u8]) -> Vec<Token> {
        let mut out = Vec::new();
        find_with_basic(bytes, &mut out);
        out
    }

    #[test]
    fn finds_raw_encoded_upper_case_and_basic_forms() {
        let p = placeholder();
        let want = Some(p.clone());
        assert!(tokens(format!("Bearer {p}").as_bytes()).contains(&want));
        assert!(tokens(format!("x{}", p.to_uppercase()).as_bytes()).contains(&want));
        let encoded = format!("%73gph%5F{}", &p[5..]);
        assert!(tokens(encoded.as_bytes()).contains(&want));
        let twice = format!("%2573gph_{}", &p[5..]);
        assert!(tokens(twice.as_bytes()).contains(&want));
        let basic = base64::engine::general_purpose::STANDARD_NO_PAD.encode(format!("u:{p}"));
        assert!(tokens(format!("Basic {basic}").as_bytes()).contains(&want));
        let basic = base64::engine::general_purpose::URL_SAFE.encode(format!("u:{p}"));
        assert!(tokens(format!("basic {basic}").as_bytes()).contains(&want));
        assert!(tokens(b"nothing here").is_empty());
    }

    #[test]
    fn a_prefix_without_a_whole_placeholder_is_malformed() {
        assert_eq!(tokens(b"sgph_short"), vec![None]);
        assert_eq!(
            tokens(format!("sgph_{}", "z".repeat(40)).as_bytes()),
            vec![None]
        );
    }

    #[test]
    fn basic_with_multibyte_text_does_not_panic() {
        assert!(decode_basic("abcd€xyz".as_bytes()).is_none());
        assert!(decode_basic("Basic €€€".as_bytes()).is_none());
        assert!(decode_basic(b"Basi").is_none());
    }

    #[test]
    fn redaction_covers_encoded_and_upper_case_forms() {
        let p = placeholder();
        for text in [
            format!("/x/{p}/y"),
            format!("/x/%73gph_{}/y", &p[5..]),
            format!("/x/{}/y", p.to_uppercase()),
        ] {
            let clean = redact(&text);
            assert_eq!(clean, "/x/sgph_[redacted]/y", "{text}");
        }
        assert_eq!(redact("/plain%20path"), "/plain%20path");
    }

    #[test]
    fn query_pairs_decode_names() {
        let pairs: Vec<_> = query_pairs("k%65y=v&&x&a+b=1").collect();
        assert_eq!(pairs.len(), 3);
        assert_eq!(pairs[0].name, b"key");
        assert_eq!(pairs[0].value, "v");
        assert_eq!(pairs[1].name, b"x");
        assert_eq!(pairs[2].name, b"a b");
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_are_scanned_without_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..128)) {
            let mut out = Vec::new();
            find_with_basic(&bytes, &mut out);
            let _ = decode_basic(&bytes);
            let text = String::from_utf8_lossy(&bytes);
            let _ = query_pairs(&text).count();
        }

        #[test]
        fn prefixes_are_found_wherever_a_naive_search_finds_them(text in "(sgph_|SGPH_|sGpH_|sgph|gph_|_|s|[a-z_%]{1,3}|€)*") {
            let bytes = text.as_bytes();
            let naive: Vec<usize> = (0..bytes.len())
                .filter(|&i| bytes[i..].len() >= 5 && bytes[i..i + 5].eq_ignore_ascii_case(b"sgph_"))
                .collect();
            proptest::prop_assert_eq!(prefix_starts(bytes).collect::<Vec<_>>(), naive);
        }

        #[test]
        fn redaction_leaves_no_placeholder(text in "(sgph_|SgPh_|%73gph_|%2573gph%5f|[a-f0-9]{1,40}|[ /?&=%€])*") {
            let clean = redact(&text);
            proptest::prop_assert!(!mentions_placeholder(clean.replace("sgph_[redacted]", "").as_bytes()), "{text} -> {clean}");
        }
    }
}
