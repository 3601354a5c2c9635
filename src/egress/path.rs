//! Request paths as the origin will read them.
//!
//! Contract: the path a policy sees, the path a credential's `path_prefix` is matched
//! against and the path that is forwarded are one and the same string, the canonical form:
//! - percent-encoded unreserved characters (`%2e`, `%41`, ...) are decoded, which RFC 3986
//!   (section 6.2.2.2) says never changes what a URI means;
//! - dot segments are removed (section 5.2.4), so `/repos/../admin` and `/repos/%2e%2e/admin`
//!   are `/admin` and `/repos/./x` is `/repos/x`.
//!
//! What canonicalisation cannot settle is reported as ambiguous: an encoded slash (`%2F`) or
//! backslash, an encoded `%` (a second decoding by the origin would reveal more), an
//! encoded NUL, and `.;`/`..;` segments (which some servers treat as dot segments). A
//! request with an ambiguous path is refused when a credential could be attached to it (see
//! `forward`), since its `path_prefix` could then be dodged; otherwise it passes as it is.
//! The query is left as sent.

/// A canonical path and query, and why the path is ambiguous if it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalPath {
    pub path_and_query: String,
    pub ambiguous: Option<&'static str>,
}

pub fn canonicalize(path_and_query: &str) -> CanonicalPath {
    let (path, query) = match path_and_query.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path_and_query, None),
    };
    if !path.starts_with('/') {
        // `*` (OPTIONS) or an empty path: nothing to resolve.
        return CanonicalPath {
            path_and_query: path_and_query.to_string(),
            ambiguous: None,
        };
    }
    let decoded = decode_unreserved(path);
    let ambiguous = ambiguity(&decoded);
    let mut out = remove_dot_segments(&decoded);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    CanonicalPath {
        path_and_query: out,
        ambiguous,
    }
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex_value(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// `%2e` → `.`, `%41` → `A`; every other escape is kept as sent.
fn decode_unreserved(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex_value(bytes[i + 1]), hex_value(bytes[i + 2])) {
                let decoded = h * 16 + l;
                if is_unreserved(decoded) {
                    out.push(decoded);
                    i += 3;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    // Only ASCII bytes were replaced by ASCII bytes, so the text stays valid UTF-8.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

fn ambiguity(path: &str) -> Option<&'static str> {
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2f") {
        return Some("an encoded slash (%2F)");
    }
    if lower.contains("%5c") || path.contains('\\') {
        return Some("a backslash");
    }
    if lower.contains("%25") {
        return Some("an encoded percent sign (%25)");
    }
    if lower.contains("%00") {
        return Some("an encoded NUL (%00)");
    }
    if path
        .split('/')
        .any(|segment| segment.starts_with(".;") || segment.starts_with("..;"))
    {
        return Some("a dot segment with parameters (.; or ..;)");
    }
    None
}

/// RFC 3986 section 5.2.4 for an absolute path.
fn remove_dot_segments(path: &str) -> String {
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let last = segments.len().saturating_sub(1);
    let mut out: Vec<&str> = Vec::with_capacity(segments.len());
    for (i, segment) in segments.iter().enumerate() {
        match *segment {
            "." => {}
            ".." => {
                out.pop();
            }
            other => {
                out.push(other);
                continue;
            }
        }
        if i == last {
            // `/a/.` and `/a/b/..` keep their trailing slash.
            out.push("");
        }
    }
    format!("/{}", out.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(p: &str) -> String {
        canonicalize(p).path_and_query
    }

    #[test]
    fn dot_segments_are_removed_in_every_spelling() {
        assert_eq!(canon("/repos/../admin/x"), "/admin/x");
        assert_eq!(canon("/repos/%2e%2e/admin/x"), "/admin/x");
        assert_eq!(canon("/repos/%2E%2e/admin/x"), "/admin/x");
        assert_eq!(canon("/repos/./forbidden"), "/repos/forbidden");
        assert_eq!(canon("/repos/.%2e/.%2E/x?a=../b"), "/x?a=../b");
        assert_eq!(canon("/../../.."), "/");
        assert_eq!(canon("/a/b/.."), "/a/");
        assert_eq!(canon("/a/."), "/a/");
        assert_eq!(canon("/"), "/");
        assert_eq!(canon("//a//b"), "//a//b");
        assert_eq!(canon("/%41%7e%20"), "/A~%20");
        assert_eq!(canon("*"), "*");
        assert_eq!(canon("/a%2"), "/a%2");
        assert_eq!(canon("/a%"), "/a%");
    }

    #[test]
    fn what_cannot_be_settled_is_ambiguous() {
        for p in [
            "/repos%2f..%2fadmin",
            "/repos%5cadmin",
            "/repos/%252e%252e/admin",
            "/a%00b",
            "/repos/..;/admin",
            "/repos/.;x/admin",
        ] {
            assert!(canonicalize(p).ambiguous.is_some(), "{p}");
        }
        assert!(canonicalize("/repos/x?q=%2f").ambiguous.is_none());
        assert!(canonicalize("/repos/a.b/..c").ambiguous.is_none());
    }

    proptest::proptest! {
        #[test]
        fn canonical_form_is_stable_and_has_no_dot_segments(path in "(/|\\.|\\.\\.|%2[eEfF]|%25|%|[a-z]|\\?|;){0,24}") {
            let path = format!("/{path}");
            let once = canonicalize(&path);
            let (before_query, _) = once.path_and_query.split_once('?').unwrap_or((&once.path_and_query, ""));
            proptest::prop_assert!(before_query.starts_with('/'));
            for segment in before_query.split('/') {
                proptest::prop_assert!(segment != "." && segment != "..", "{path} -> {}", once.path_and_query);
            }
            proptest::prop_assert_eq!(&canonicalize(&once.path_and_query).path_and_query, &once.path_and_query);
        }

        #[test]
        fn any_bytes_are_handled(path in proptest::collection::vec(proptest::prelude::any::<char>(), 0..64)) {
            let path: String = path.into_iter().collect();
            let _ = canonicalize(&path);
            let _ = canonicalize(&format!("/{path}"));
        }
    }
}
