//! Host names and host patterns as sandgate compares them.
//!
//! A pattern is an exact name (`api.example.com`) or a wildcard `*.example.com`, which
//! matches any name strictly below `example.com` (not `example.com` itself: that is how
//! certificate wildcards and most allow-lists read, and a user who wants both lists both).
//! Names are compared in lower case without a trailing dot.

/// Lower-cases a host and drops one trailing dot, so `API.Example.com.` and
/// `api.example.com` are the same destination.
pub fn normalize_host(host: &str) -> String {
    let host = host.strip_suffix('.').unwrap_or(host);
    host.to_ascii_lowercase()
}

/// Checks that `pattern` is an exact host name or a leading `*.` wildcard.
pub fn validate_pattern(pattern: &str) -> Result<(), String> {
    if pattern.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    let name = pattern.strip_prefix("*.").unwrap_or(pattern);
    if name.is_empty() {
        return Err(format!("{pattern:?} is empty"));
    }
    if name.contains('*') {
        return Err(format!(
            "{pattern:?}: a wildcard is allowed only as a leading \"*.\""
        ));
    }
    let ok = name.split('.').all(|label| {
        !label.is_empty()
            && label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    });
    if !ok {
        return Err(format!(
            "{pattern:?} is not a host name or *.suffix pattern"
        ));
    }
    Ok(())
}

/// Whether `host` (already normalized) is matched by `pattern`.
pub fn matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => {
            let Some(cut) = host.len().checked_sub(suffix.len() + 1) else {
                return false;
            };
            cut > 0
                && host.as_bytes()[cut] == b'.'
                && host
                    .get(cut + 1..)
                    .is_some_and(|tail| tail.eq_ignore_ascii_case(suffix))
        }
        None => pattern.eq_ignore_ascii_case(host),
    }
}

/// The names a destination can be allowed by: the host itself, then each `*.parent`
/// wildcard from the nearest parent outwards. Lets policy look a host up in a set
/// instead of scanning every pattern.
pub fn match_names(host: &str) -> Vec<String> {
    let mut names = vec![host.to_string()];
    let mut rest = host;
    while let Some((_, parent)) = rest.split_once('.') {
        if parent.is_empty() {
            break;
        }
        names.push(format!("*.{parent}"));
        rest = parent;
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_matches_only_strict_subdomains() {
        assert!(matches("*.example.com", "api.example.com"));
        assert!(matches("*.example.com", "a.b.example.com"));
        assert!(!matches("*.example.com", "example.com"));
        assert!(!matches("*.example.com", "badexample.com"));
        assert!(matches("api.example.com", "api.example.com"));
        assert!(!matches("api.example.com", "x.api.example.com"));
    }

    #[test]
    fn match_names_lists_wildcards_outwards() {
        assert_eq!(
            match_names("a.b.example.com"),
            vec![
                "a.b.example.com",
                "*.b.example.com",
                "*.example.com",
                "*.com"
            ]
        );
        assert_eq!(match_names("localhost"), vec!["localhost"]);
    }

    #[test]
    fn patterns_are_validated() {
        assert!(validate_pattern("*.example.com").is_ok());
        assert!(validate_pattern("api.example.com").is_ok());
        assert!(validate_pattern("a.*.com").is_err());
        assert!(validate_pattern("*").is_err());
        assert!(validate_pattern("").is_err());
        assert!(validate_pattern("exa mple.com").is_err());
    }

    #[test]
    fn hosts_are_normalized() {
        assert_eq!(normalize_host("API.Example.COM."), "api.example.com");
    }
}
