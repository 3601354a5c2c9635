//! Egress by address: a sandbox's `network.cidrs`.
//!
//! A sandbox created with `network: {cidrs: [...]}` may reach those addresses whatever
//! name (or none) it uses. Policy decides, as for names: the CIDRs are policy input
//! (`input.sandbox.cidrs`, each `address/prefix`), the addresses a connection would be
//! dialed on are `input.destination.ips` (with `ip`, the first of them), and the bundled
//! `egress.rego` allows a destination all of whose addresses lie inside the sandbox's CIDRs.
//!
//! When the address is known:
//! - an IP literal (`CONNECT 10.1.2.3:443`, `http://10.1.2.3/`) is its own address from the
//!   first evaluation on;
//! - a name is not resolved before the first evaluation (a name the policy refuses is never
//!   looked up: DNS queries are an exfiltration channel). Only for a sandbox with CIDRs, and
//!   only when that first evaluation refused for want of an `allow` (no `deny` entry, no
//!   error), the name is resolved and vetted and the policy asked again with its addresses:
//!   that is the only way to learn whether it points into a CIDR. So such a sandbox can have
//!   sandgate look up names that end up refused; `cidrs` is the request that asks for it.
//!
//! Either way the private-address guard (`net::guard`) vets the addresses before any
//! policy sees them as dialable: CIDRs never exempt loopback, private or metadata ranges;
//! only `[egress] allow_private` does (and nothing exempts metadata).

use std::net::IpAddr;

use crate::identity::Identity;
use crate::policy::Decision;

/// Whether a refused egress decision on a name deserves a second one with the name's
/// resolved addresses: only for a sandbox with CIDRs, only for a name (an IP literal's
/// address was already known), and only when nothing but a missing `allow` refused it.
pub(crate) fn ask_again_with_addresses(
    identity: &Identity,
    literal: Option<IpAddr>,
    decision: &Decision,
) -> bool {
    !decision.allowed && decision.default_deny && literal.is_none() && !identity.cidrs.is_empty()
}

/// The IP literal `host` names, if it is one (brackets already removed).
pub(crate) fn literal(host: &str) -> Option<IpAddr> {
    host.parse().ok()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;
    use crate::identity::parse_cidrs;

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn bare_addresses_are_host_routes_and_host_bits_are_cleared() {
        let nets = parse_cidrs(
            "sb",
            &strings(&[
                "127.0.0.2",
                "10.1.2.3/8",
                "fd00::1",
                "2001:db8::1/32",
                "nope",
            ]),
        );
        let shown: Vec<String> = nets.iter().map(|n| n.to_string()).collect();
        assert_eq!(
            shown,
            ["127.0.0.2/32", "10.0.0.0/8", "fd00::1/128", "2001:db8::/32"]
        );
    }

    fn decision(allowed: bool, default_deny: bool) -> Decision {
        Decision {
            allowed,
            reasons: Vec::new(),
            action: "inspect".into(),
            deny_mode: None,
            generation: 1,
            eval_time: Duration::ZERO,
            decision_id: None,
            deny_scope: None,
            default_deny,
            logged: None,
            would_deny: Vec::new(),
        }
    }

    #[test]
    fn only_a_default_deny_on_a_name_of_a_sandbox_with_cidrs_is_asked_again() {
        let plain = Identity::new("sb", "t", "ws", vec![], BTreeMap::new());
        let with = Identity::new("sb", "t", "ws", vec![], BTreeMap::new())
            .with_cidrs(&strings(&["10.0.0.0/8"]));
        let ip = Some("10.0.0.1".parse().unwrap());
        assert!(ask_again_with_addresses(
            &with,
            None,
            &decision(false, true)
        ));
        // No CIDRs, an IP literal, an allow, or an explicit deny (or error): never.
        assert!(!ask_again_with_addresses(
            &plain,
            None,
            &decision(false, true)
        ));
        assert!(!ask_again_with_addresses(&with, ip, &decision(false, true)));
        assert!(!ask_again_with_addresses(
            &with,
            None,
            &decision(true, false)
        ));
        assert!(!ask_again_with_addresses(
            &with,
            None,
            &decision(false, false)
        ));
    }
}
