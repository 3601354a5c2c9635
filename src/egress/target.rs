//! Where a sandbox asked to go, and who asked.

use std::sync::Arc;

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
    /// The sandbox part of every policy input, built once per tunnel.
    pub sandbox: regorus::Value,
}

impl Target {
    pub fn new(identity: Arc<Identity>, host: String, port: u16) -> Target {
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let sandbox = sandbox_value(&identity);
        Target {
            identity,
            host,
            port,
            authority,
            sandbox,
        }
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
