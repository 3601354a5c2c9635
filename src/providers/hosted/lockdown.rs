//! The steps every hosted adapter takes to lock a sandbox to the gateway.
//!
//! Contract:
//! - A sandbox with egress gets the proxy and CA variables ([`create_env`]) whether or not
//!   its pool locks down; the native allow entry that names only the gateway is provider
//!   specific (each adapter's `lockdown`), built from [`gateway_addr`] so every adapter
//!   reads the gateway's host the same way.
//! - sandgate's CA is written into the sandbox once it runs; when that fails the instance is
//!   not used: [`ca_not_installed`] names it so the coordinator deletes it.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::errors::failed_before_running;
use crate::providers::{CreateSpec, ProviderError};

/// The gateway's public host, as an allow list can name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatewayAddr<'a> {
    V4(Ipv4Addr),
    V6(Ipv6Addr),
    /// A DNS name (or anything that is not an IP literal), brackets removed.
    Name(&'a str),
}

/// Reads a host as written in a URL (`[2001:db8::1]` or bare), surrounding spaces ignored.
pub fn gateway_addr(host: &str) -> GatewayAddr<'_> {
    let host = host.trim().trim_start_matches('[').trim_end_matches(']');
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => GatewayAddr::V4(ip),
        Ok(IpAddr::V6(ip)) => GatewayAddr::V6(ip),
        Err(_) => GatewayAddr::Name(host),
    }
}

/// The environment of a create: the spec's, plus the proxy and CA variables (naming
/// `ca_path`) when the sandbox has egress through the gateway.
pub fn create_env(spec: &CreateSpec, ca_path: &str) -> BTreeMap<String, String> {
    let mut env = spec.env.clone();
    if let Some(egress) = &spec.egress {
        env.extend(egress.env(ca_path));
    }
    env
}

/// A create whose CA could not be written: the instance `id` is left for deletion.
/// `what` is the provider's word for it ("sandbox", "devbox").
pub fn ca_not_installed(id: &str, what: &str, e: impl std::fmt::Display) -> ProviderError {
    failed_before_running(id, format!("the {what}'s CA could not be installed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_read_once() {
        assert_eq!(
            gateway_addr(" 203.0.113.7 "),
            GatewayAddr::V4(Ipv4Addr::new(203, 0, 113, 7))
        );
        assert!(matches!(gateway_addr("[2001:db8::1]"), GatewayAddr::V6(_)));
        assert!(matches!(gateway_addr("2001:db8::1"), GatewayAddr::V6(_)));
        assert_eq!(gateway_addr("gw.example"), GatewayAddr::Name("gw.example"));
        assert_eq!(
            gateway_addr("203.0.113.7:3128"),
            GatewayAddr::Name("203.0.113.7:3128")
        );
    }
}
