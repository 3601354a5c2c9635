//! Where a sandbox asked to go, and who asked.

use std::sync::Arc;

use crate::decision_log::SharedObject;
use crate::identity::Identity;
use crate::policy::input::sandbox_value;

/// The CONNECT authority or the absolute URI's authority, with the identity it was asked
/// under. Never taken from a Host header.
pub(crate) struct Target {
    pub identity: Arc<Identity>,
    /// Lower-case; IPv6 literals without brackets.
    pub host: String,
    pub port: u16,
    /// `host:port` as it goes into an upstream URI.
    pub authority: String,
    /// [`Self::authority`] parsed once per tunnel, for [`Self::upstream_uri`].
    uri_authority: Option<http::uri::Authority>,
    /// The sandbox part of every policy input, built once per tunnel (and rendered for the
    /// decision log once per tunnel).
    pub sandbox: Arc<SharedObject>,
}

impl Target {
    pub fn new(identity: Arc<Identity>, host: String, port: u16) -> Target {
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let sandbox = SharedObject::new(sandbox_value(&identity));
        let uri_authority = authority.parse().ok();
        Target {
            identity,
            host,
            port,
            authority,
            uri_authority,
            sandbox,
        }
    }

    /// The upstream URI of a request to this target: the URI `{scheme}://{authority}{path}`
    /// parses to (`None` where that text does not parse), built from the authority parsed
    /// once per tunnel, so a request pays only for checking its own path.
    pub fn upstream_uri(&self, scheme: &str, path_and_query: &str) -> Option<http::Uri> {
        let (Some(authority), true) = (&self.uri_authority, path_and_query.starts_with('/')) else {
            // Paths that are not origin-form: whatever the text makes of them.
            return format!("{scheme}://{}{path_and_query}", self.authority)
                .parse()
                .ok();
        };
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(match scheme {
            "https" => http::uri::Scheme::HTTPS,
            "http" => http::uri::Scheme::HTTP,
            other => other.parse().ok()?,
        });
        parts.authority = Some(authority.clone());
        parts.path_and_query = Some(path_and_query.parse().ok()?);
        http::Uri::from_parts(parts).ok()
    }
}

/// Host (lower-case, IPv6 without brackets) and port of an authority.
pub(crate) fn split_authority(
    authority: &http::uri::Authority,
    default_port: u16,
) -> Option<(String, u16)> {
    let host = authority.host();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return None;
    }
    Some((
        crate::domain::normalize_host(host),
        authority.port_u16().unwrap_or(default_port),
    ))
}

#[cfg(test)]
#[path = "target_tests.rs"]
mod tests;
