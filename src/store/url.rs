//! `[store] url`: a Postgres connection URL whose password never shows. It is checked when the
//! configuration is read (scheme, parameters) and printed, by `Debug` and `Display` alike,
//! with every password replaced by `***`, so it can go into logs and error messages.

use std::fmt;

/// What a redacted password reads as.
const REDACTED: &str = "***";

/// The connection parameters sqlx's Postgres driver understands in a URL's query. Anything
/// else is refused: the driver would log an unknown parameter with its value (a misspelt
/// `password` would put the password in the log), and a misspelt security setting such as
/// `sslmode` must not silently fall back to the default.
const KNOWN_PARAMETERS: [&str; 18] = [
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// Whether the driver understands a query parameter.
fn is_known(key: &str) -> bool {
    KNOWN_PARAMETERS.contains(&key) || (key.starts_with("options[") && key.ends_with(']'))
}

/// A `postgres://` (or `postgresql://`) URL. The only way to the text with the password is
/// [`DatabaseUrl::expose`], which the store calls to connect.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    url: url::Url,
}

impl DatabaseUrl {
    /// Parses and checks a URL: the scheme is `postgres` or `postgresql`, and the query only
    /// holds parameters the driver knows. Errors never repeat the password.
    pub fn parse(text: &str) -> Result<DatabaseUrl, String> {
        // The parser's own errors ("invalid port number", ...) do not echo the input.
        let url = url::Url::parse(text).map_err(|e| format!("not a URL: {e}"))?;
        let parsed = DatabaseUrl { url };
        let scheme = parsed.url.scheme();
        if !matches!(scheme, "postgres" | "postgresql") {
            return Err(format!(
                "{parsed}: the scheme must be postgres:// (or postgresql://), not {scheme}://; for SQLite set store.path instead"
            ));
        }
        for (key, _) in parsed.url.query_pairs() {
            if !is_known(&key) {
                return Err(format!(
                    "{parsed}: unknown connection parameter {key:?} (known: {})",
                    KNOWN_PARAMETERS.join(", ")
                ));
            }
        }
        Ok(parsed)
    }

    /// The URL with its password, to connect with. Never log it.
    pub fn expose(&self) -> &str {
        self.url.as_str()
    }

    /// The URL with the password (in the user part and any `password` parameter) replaced
    /// by `***`, as are the values of parameters the driver does not know (a misspelt
    /// `password` is still a password).
    pub fn redacted(&self) -> String {
        let mut url = self.url.clone();
        if url.password().is_some() {
            // Fails only for URLs that cannot have a password (no host), which have none.
            let _ = url.set_password(Some(REDACTED));
        }
        let hidden = |key: &str| key == "password" || !is_known(key);
        if url.query_pairs().any(|(k, _)| hidden(&k)) {
            let pairs: Vec<(String, String)> = url
                .query_pairs()
                .map(|(k, v)| {
                    let v = if hidden(&k) {
                        REDACTED.to_string()
                    } else {
                        v.into_owned()
                    };
                    (k.into_owned(), v)
                })
                .collect();
            url.query_pairs_mut().clear().extend_pairs(pairs);
        }
        url.to_string()
    }

    /// The passwords this URL carries (decoded), so that text from elsewhere (a driver's
    /// error message) can be scrubbed of them before it is shown.
    pub(crate) fn passwords(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(p) = self.url.password() {
            out.push(
                percent_encoding::percent_decode_str(p)
                    .decode_utf8_lossy()
                    .into_owned(),
            );
            out.push(p.to_string());
        }
        for (k, v) in self.url.query_pairs() {
            if k == "password" {
                out.push(v.into_owned());
            }
        }
        out.retain(|p| !p.is_empty());
        out
    }

    /// The same server and credentials, another database (tests create one per test).
    pub fn with_database(&self, database: &str) -> DatabaseUrl {
        let mut url = self.url.clone();
        url.set_path(&format!("/{database}"));
        // A `dbname` parameter would win over the path.
        if url.query_pairs().any(|(k, _)| k == "dbname") {
            let pairs: Vec<(String, String)> = url
                .query_pairs()
                .filter(|(k, _)| k != "dbname")
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
            if pairs.is_empty() {
                url.set_query(None);
            } else {
                url.query_pairs_mut().clear().extend_pairs(pairs);
            }
        }
        DatabaseUrl { url }
    }

    /// Replaces every password of this URL found in `text` by `***`. Passwords shorter than
    /// four characters are left alone: scrubbing them would garble the message, and such a
    /// password protects nothing anyway.
    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for p in self.passwords() {
            if p.chars().count() >= 4 {
                out = out.replace(&p, REDACTED);
            }
        }
        out
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DatabaseUrl({:?})", self.redacted())
    }
}

impl<'de> serde::Deserialize<'de> for DatabaseUrl {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        DatabaseUrl::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_never_shows() {
        let url =
            DatabaseUrl::parse("postgres://app:s3cr%40t-pw@db.example:5433/sandgate").unwrap();
        for shown in [
            url.to_string(),
            format!("{url:?}"),
            url.redacted(),
            url.scrub("auth failed for s3cr@t-pw and s3cr%40t-pw"),
        ] {
            assert!(!shown.contains("s3cr"), "{shown}");
        }
        assert_eq!(
            url.to_string(),
            "postgres://app:***@db.example:5433/sandgate"
        );
        assert_eq!(
            url.expose(),
            "postgres://app:s3cr%40t-pw@db.example:5433/sandgate"
        );
    }

    #[test]
    fn a_password_parameter_is_redacted_too() {
        let url = DatabaseUrl::parse(
            "postgresql://db/sandgate?user=app&password=hunter22&sslmode=require",
        )
        .unwrap();
        let shown = format!("{url} {url:?}");
        assert!(!shown.contains("hunter22"), "{shown}");
        assert!(shown.contains("sslmode=require"), "{shown}");
        assert!(url.expose().contains("hunter22"));
    }

    #[test]
    fn other_schemes_and_unknown_parameters_are_refused() {
        for (text, needle) in [
            ("sqlite://data/sandgate.db", "scheme"),
            ("mysql://u:pw1234@h/db", "scheme"),
            ("data/sandgate.db", "not a URL"),
            (
                "postgres://u:pw1234@h/db?passwrd=pw1234",
                "unknown connection parameter",
            ),
            (
                "postgres://u:pw1234@h/db?ssl_mode=require",
                "unknown connection parameter",
            ),
        ] {
            let err = DatabaseUrl::parse(text).unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
            assert!(!err.contains("pw1234"), "{text}: {err}");
        }
        assert!(DatabaseUrl::parse("postgres://h/db?options[search_path]=x").is_ok());
        assert!(DatabaseUrl::parse("postgres:///db?host=/run/postgresql").is_ok());
    }

    #[test]
    fn with_database_keeps_the_server_and_credentials() {
        let url = DatabaseUrl::parse("postgres://u:pw@h:1/a?dbname=b&sslmode=disable").unwrap();
        assert_eq!(
            url.with_database("c").expose(),
            "postgres://u:pw@h:1/c?sslmode=disable"
        );
    }
}
