//! The private-address guard: a sandbox must not reach the gateway's own network, cloud
//! metadata, or anything that is not the public internet, unless the operator exempts a
//! range with `[egress] allow_private`. IPv6 forms that embed an IPv4 address (v4-mapped,
//! v4-compatible, NAT64, 6to4, Teredo) are judged by the address they embed, since that is
//! where the packets end up.
//!
//! # Cloud metadata endpoints
//!
//! These answer an instance's (or a node's, or a task's) own cloud credentials and
//! configuration to whoever asks from the machine, so a sandbox reaching one through the
//! gateway would be asking with the gateway's identity. They are refused as
//! [`Forbidden::Metadata`] and, unlike every other class, **no `allow_private` entry exempts
//! them**, not a broad range (`0.0.0.0/0`, `169.254.0.0/16`) and not an exact listing
//! (`169.254.169.254/32`): no sandbox workload needs the host's metadata, an exact listing is
//! more likely a mistake than a need, and a rule that always holds is one an operator cannot
//! get wrong. [`METADATA_V4`] and [`METADATA_V6`] are the list:
//!
//! | address | what answers there |
//! | --- | --- |
//! | `169.254.169.254` | the instance metadata service of AWS, GCP (`metadata.google.internal`), Azure (IMDS), Oracle Cloud, DigitalOcean, OpenStack, Hetzner, ... |
//! | `169.254.170.2` | AWS ECS task metadata and task-role credentials |
//! | `169.254.170.23` | AWS EKS Pod Identity agent (pod credentials) |
//! | `168.63.129.16` | Azure WireServer (guest agent, extension settings and certificates); a *public* address, so only this list refuses it |
//! | `100.100.100.200` | Alibaba Cloud metadata service |
//! | `192.0.0.192` | Oracle Cloud Classic metadata service |
//! | `fd00:ec2::254` | AWS instance metadata over IPv6 |
//! | `fd00:ec2::23` | AWS EKS Pod Identity agent over IPv6 |
//! | `fe80::a9fe:a9fe` | OpenStack metadata over IPv6 |
//!
//! Every IPv6 form embedding one of the IPv4 addresses (`::ffff:168.63.129.16`,
//! `64:ff9b::a83f:8110`, ...) is the same endpoint and refused the same way. Other
//! link-local service addresses (AWS's DNS resolver `169.254.169.253` and time server
//! `169.254.169.123`) hand out no credentials: they are refused as link-local, and an
//! exemption covering them applies.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forbidden {
    Loopback,
    Private,
    LinkLocal,
    Metadata,
    SharedCgnat,
    Multicast,
    Unspecified,
    Reserved,
    Gateway,
}

impl Forbidden {
    pub fn as_str(self) -> &'static str {
        match self {
            Forbidden::Loopback => "loopback",
            Forbidden::Private => "private",
            Forbidden::LinkLocal => "link-local",
            Forbidden::Metadata => "cloud-metadata",
            Forbidden::SharedCgnat => "shared-address-space",
            Forbidden::Multicast => "multicast",
            Forbidden::Unspecified => "unspecified",
            Forbidden::Reserved => "reserved",
            Forbidden::Gateway => "sandgate-listener",
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct AddressGuard {
    allow: Vec<IpNet>,
    own_listeners: Vec<SocketAddr>,
}

impl AddressGuard {
    pub fn new(allow: Vec<IpNet>, own_listeners: Vec<SocketAddr>) -> Self {
        for net in &allow {
            if net.prefix_len() == net.max_prefix_len() && is_metadata(net.addr()) {
                tracing::warn!(
                    range = %net,
                    "[egress] allow_private lists a cloud metadata address; metadata addresses are never exempt, so it stays refused"
                );
            }
        }
        AddressGuard {
            allow,
            own_listeners,
        }
    }

    /// `Ok` when `addr` may be dialed. sandgate's own listeners are refused even when their
    /// range is exempt: a sandbox talking to the gateway through the gateway is a loop at
    /// best and a confused deputy at worst. A listener on an unspecified address (0.0.0.0)
    /// answers on every local address, which we cannot enumerate portably, so its port is
    /// refused on every address. Cloud metadata addresses are refused whatever is exempt
    /// (see the [module documentation](self)).
    pub fn check(&self, addr: SocketAddr) -> Result<(), Forbidden> {
        for own in &self.own_listeners {
            let same_ip = own.ip() == addr.ip() || own.ip().is_unspecified();
            if own.port() == addr.port() && same_ip {
                return Err(Forbidden::Gateway);
            }
        }
        let Some(why) = classify(addr.ip()) else {
            return Ok(());
        };
        if why == Forbidden::Metadata {
            return Err(why);
        }
        if self.allow.iter().any(|net| net.contains(&addr.ip())) {
            return Ok(());
        }
        Err(why)
    }
}

/// Cloud metadata endpoints (IPv4); see the [module documentation](self).
pub const METADATA_V4: &[Ipv4Addr] = &[
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(169, 254, 170, 2),
    Ipv4Addr::new(169, 254, 170, 23),
    Ipv4Addr::new(168, 63, 129, 16),
    Ipv4Addr::new(100, 100, 100, 200),
    Ipv4Addr::new(192, 0, 0, 192),
];

/// Cloud metadata endpoints (IPv6); see the [module documentation](self).
pub const METADATA_V6: &[Ipv6Addr] = &[
    Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254),
    Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23),
    Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0xa9fe, 0xa9fe),
];

/// Whether `ip` is a cloud metadata endpoint, in any form.
pub fn is_metadata(ip: IpAddr) -> bool {
    classify(ip) == Some(Forbidden::Metadata)
}

/// Classifies an address; `None` means publicly routable.
pub fn classify(ip: IpAddr) -> Option<Forbidden> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<Forbidden> {
    let o = ip.octets();
    if METADATA_V4.contains(&ip) {
        return Some(Forbidden::Metadata);
    }
    if o[0] == 0 {
        return Some(Forbidden::Unspecified);
    }
    if ip.is_loopback() {
        return Some(Forbidden::Loopback);
    }
    if ip.is_private() {
        return Some(Forbidden::Private);
    }
    if ip.is_link_local() {
        return Some(Forbidden::LinkLocal);
    }
    if o[0] == 100 && (o[1] & 0xc0) == 64 {
        return Some(Forbidden::SharedCgnat);
    }
    if ip.is_multicast() {
        return Some(Forbidden::Multicast);
    }
    // 240/4 (reserved, includes broadcast), 192.0.0/24 (protocol assignments),
    // 198.18/15 (benchmarking), and the documentation ranges.
    if o[0] >= 240
        || (o[0] == 192 && o[1] == 0 && o[2] == 0)
        || (o[0] == 198 && (o[1] & 0xfe) == 18)
        || (o[0] == 192 && o[1] == 0 && o[2] == 2)
        || (o[0] == 198 && o[1] == 51 && o[2] == 100)
        || (o[0] == 203 && o[1] == 0 && o[2] == 113)
    {
        return Some(Forbidden::Reserved);
    }
    None
}

fn classify_v6(ip: Ipv6Addr) -> Option<Forbidden> {
    if let Some(v4) = embedded_v4(ip) {
        return classify_v4(v4);
    }
    let s = ip.segments();
    if ip.is_unspecified() {
        return Some(Forbidden::Unspecified);
    }
    if ip.is_loopback() {
        return Some(Forbidden::Loopback);
    }
    if METADATA_V6.contains(&ip) {
        return Some(Forbidden::Metadata);
    }
    if (s[0] & 0xfe00) == 0xfc00 {
        return Some(Forbidden::Private);
    }
    if (s[0] & 0xffc0) == 0xfe80 || (s[0] & 0xffc0) == 0xfec0 {
        return Some(Forbidden::LinkLocal);
    }
    if (s[0] & 0xff00) == 0xff00 {
        return Some(Forbidden::Multicast);
    }
    // Documentation (2001:db8::/32), discard-only (100::/64).
    if (s[0] == 0x2001 && s[1] == 0x0db8) || (s[0] == 0x0100 && s[1..4] == [0, 0, 0]) {
        return Some(Forbidden::Reserved);
    }
    None
}

/// The IPv4 address an IPv6 address delivers to, for the forms that embed one.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let o = ip.octets();
    let tail = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    // ::ffff:a.b.c.d (v4-mapped) and ::a.b.c.d (v4-compatible; not :: or ::1).
    if s[..5] == [0, 0, 0, 0, 0] && (s[5] == 0xffff || (s[5] == 0 && (s[6] != 0 || s[7] > 1))) {
        return Some(tail);
    }
    // 64:ff9b::/96 (well-known NAT64) and 64:ff9b:1::/48 (local-use NAT64).
    if s[0] == 0x64 && s[1] == 0xff9b && (s[2..6] == [0, 0, 0, 0] || s[2] == 1) {
        return Some(tail);
    }
    // 2002:AABB:CCDD::/48 (6to4).
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    // 2001:0::/32 (Teredo): the client address is stored inverted in the last 32 bits.
    if s[0] == 0x2001 && s[1] == 0 {
        return Some(Ipv4Addr::new(!o[12], !o[13], !o[14], !o[15]));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(s: &str) -> Option<Forbidden> {
        classify(s.parse().unwrap())
    }

    #[test]
    fn public_addresses_pass() {
        assert_eq!(f("1.1.1.1"), None);
        assert_eq!(f("2606:4700:4700::1111"), None);
        assert_eq!(f("100.128.0.1"), None);
    }

    #[test]
    fn ipv4_special_ranges_are_refused() {
        assert_eq!(f("127.0.0.1"), Some(Forbidden::Loopback));
        assert_eq!(f("10.1.2.3"), Some(Forbidden::Private));
        assert_eq!(f("172.16.0.1"), Some(Forbidden::Private));
        assert_eq!(f("192.168.1.1"), Some(Forbidden::Private));
        assert_eq!(f("169.254.169.254"), Some(Forbidden::Metadata));
        assert_eq!(f("169.254.1.1"), Some(Forbidden::LinkLocal));
        assert_eq!(f("100.64.0.1"), Some(Forbidden::SharedCgnat));
        assert_eq!(f("100.100.100.200"), Some(Forbidden::Metadata));
        assert_eq!(f("224.0.0.1"), Some(Forbidden::Multicast));
        assert_eq!(f("0.0.0.0"), Some(Forbidden::Unspecified));
        assert_eq!(f("255.255.255.255"), Some(Forbidden::Reserved));
    }

    #[test]
    fn ipv6_special_ranges_are_refused() {
        assert_eq!(f("::1"), Some(Forbidden::Loopback));
        assert_eq!(f("::"), Some(Forbidden::Unspecified));
        assert_eq!(f("fd12::1"), Some(Forbidden::Private));
        assert_eq!(f("fe80::1"), Some(Forbidden::LinkLocal));
        assert_eq!(f("ff02::1"), Some(Forbidden::Multicast));
        assert_eq!(f("fd00:ec2::254"), Some(Forbidden::Metadata));
    }

    #[test]
    fn ipv6_forms_embedding_ipv4_are_judged_by_the_embedded_address() {
        assert_eq!(f("::ffff:169.254.169.254"), Some(Forbidden::Metadata));
        assert_eq!(f("::ffff:127.0.0.1"), Some(Forbidden::Loopback));
        assert_eq!(f("::10.0.0.1"), Some(Forbidden::Private));
        assert_eq!(f("64:ff9b::a9fe:a9fe"), Some(Forbidden::Metadata));
        assert_eq!(f("64:ff9b:1::0a00:0001"), Some(Forbidden::Private));
        assert_eq!(f("2002:7f00:0001::1"), Some(Forbidden::Loopback));
        // Teredo with client 127.0.0.1 stored inverted: 0x80ff:fffe.
        assert_eq!(
            f("2001:0:4136:e378:8000:63bf:80ff:fffe"),
            Some(Forbidden::Loopback)
        );
        assert_eq!(f("::ffff:8.8.8.8"), None);
    }

    #[test]
    fn cloud_metadata_endpoints_are_metadata_in_every_form() {
        for ip in [
            "169.254.169.254",
            "169.254.170.2",
            "169.254.170.23",
            "168.63.129.16",
            "100.100.100.200",
            "192.0.0.192",
            "fd00:ec2::254",
            "fd00:ec2::23",
            "fe80::a9fe:a9fe",
            // IPv6 forms embedding the public one: v4-mapped, v4-compatible, NAT64, 6to4,
            // and Teredo (client stored inverted: !168.63.129.16 = 57.c0.7e.ef).
            "::ffff:168.63.129.16",
            "::168.63.129.16",
            "64:ff9b::a83f:8110",
            "64:ff9b:1::a83f:8110",
            "2002:a83f:8110::1",
            "2001:0:4136:e378:8000:63bf:57c0:7eef",
            "::ffff:169.254.170.2",
        ] {
            assert_eq!(f(ip), Some(Forbidden::Metadata), "{ip}");
            assert!(is_metadata(ip.parse().unwrap()), "{ip}");
        }
        // Neighbours are what they always were.
        assert_eq!(f("168.63.129.17"), None);
        assert_eq!(f("169.254.169.253"), Some(Forbidden::LinkLocal));
        assert_eq!(f("192.0.0.193"), Some(Forbidden::Reserved));
        assert_eq!(f("fd00:ec2::253"), Some(Forbidden::Private));
        assert_eq!(f("fe80::a9fe:a9ff"), Some(Forbidden::LinkLocal));
    }

    #[test]
    fn no_exemption_covers_a_metadata_address() {
        let everything = AddressGuard::new(
            vec![
                "0.0.0.0/0".parse().unwrap(),
                "::/0".parse().unwrap(),
                "169.254.0.0/16".parse().unwrap(),
                "168.63.129.16/32".parse().unwrap(),
                "fd00:ec2::254/128".parse().unwrap(),
            ],
            vec![],
        );
        for addr in [
            "169.254.169.254:80",
            "168.63.129.16:80",
            "169.254.170.2:80",
            "100.100.100.200:80",
            "192.0.0.192:80",
            "[fd00:ec2::254]:80",
            "[::ffff:168.63.129.16]:80",
            "[64:ff9b::a9fe:a9fe]:80",
        ] {
            assert_eq!(
                everything.check(addr.parse().unwrap()),
                Err(Forbidden::Metadata),
                "{addr}"
            );
        }
        // What the ranges do exempt stays exempt.
        for addr in [
            "10.0.0.1:80",
            "169.254.1.1:80",
            "169.254.169.253:53",
            "[fd12::1]:80",
        ] {
            assert_eq!(everything.check(addr.parse().unwrap()), Ok(()), "{addr}");
        }
    }

    #[test]
    fn exemptions_and_own_listeners() {
        let own: SocketAddr = "127.0.0.1:3128".parse().unwrap();
        let guard = AddressGuard::new(vec!["127.0.0.0/8".parse().unwrap()], vec![own]);
        assert_eq!(guard.check("127.0.0.1:8443".parse().unwrap()), Ok(()));
        assert_eq!(guard.check(own), Err(Forbidden::Gateway));
        assert_eq!(
            guard.check("169.254.169.254:80".parse().unwrap()),
            Err(Forbidden::Metadata)
        );
        let any = AddressGuard::new(vec![], vec!["0.0.0.0:3128".parse().unwrap()]);
        assert_eq!(
            any.check("8.8.8.8:3128".parse().unwrap()),
            Err(Forbidden::Gateway)
        );
    }
}
