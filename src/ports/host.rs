//! Reading `{port}-{sandbox}.{domain}` out of a host name, strictly: whatever a client sends
//! as `Host` or TLS server name is hostile input.

/// Longest host name taken (RFC 1035's limit on a name).
const MAX_HOST: usize = 253;

/// One port of one sandbox, as a host name names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub port: u16,
    pub sandbox: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("the request names no host")]
    Missing,
    #[error("the host name is longer than 253 characters")]
    TooLong,
    #[error("the host is not under this gateway's ports domain")]
    OtherDomain,
    #[error("the host must be {{port}}-{{sandbox id}}.{{domain}}")]
    Malformed,
    #[error("the port in the host name must be 1 to 65535")]
    BadPort,
}

/// The target `host` names under `domain` (lower-case). `host` may carry a `:port`
/// suffix (a `Host` header's), which is ignored; letters are compared without case.
pub fn parse(host: &str, domain: &str) -> Result<Target, HostError> {
    if host.is_empty() {
        return Err(HostError::Missing);
    }
    if host.len() > MAX_HOST + 6 {
        return Err(HostError::TooLong);
    }
    let name = strip_port(host)?;
    if name.len() > MAX_HOST {
        return Err(HostError::TooLong);
    }
    let name = name.to_ascii_lowercase();
    let name = name.strip_suffix('.').unwrap_or(&name);
    let label = name
        .strip_suffix(domain)
        .and_then(|rest| rest.strip_suffix('.'))
        .ok_or(HostError::OtherDomain)?;
    let (port, sandbox) = label.split_once('-').ok_or(HostError::Malformed)?;
    let sandbox_ok = !sandbox.is_empty()
        && sandbox.len() <= 63
        && sandbox
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !sandbox.starts_with('-')
        && !sandbox.ends_with('-');
    if !sandbox_ok {
        return Err(HostError::Malformed);
    }
    Ok(Target {
        port: parse_port(port)?,
        sandbox: sandbox.to_string(),
    })
}

/// `host` without a trailing `:digits`; an IPv6 literal is never a ports host.
fn strip_port(host: &str) -> Result<&str, HostError> {
    if host.starts_with('[') {
        return Err(HostError::OtherDomain);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            Ok(name)
        }
        Some(_) => Err(HostError::Malformed),
        None => Ok(host),
    }
}

/// 1 to 65535, decimal digits only, no leading zero (one spelling per port).
fn parse_port(text: &str) -> Result<u16, HostError> {
    let digits = !text.is_empty() && text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit());
    if !digits || text.starts_with('0') {
        return Err(HostError::BadPort);
    }
    match text.parse::<u32>() {
        Ok(n @ 1..=65535) => Ok(n as u16),
        _ => Err(HostError::BadPort),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sandgate.localhost";

    fn ok(host: &str) -> (u16, String) {
        let t = parse(host, D).unwrap_or_else(|e| panic!("{host}: {e}"));
        (t.port, t.sandbox)
    }

    #[test]
    fn a_ports_host_names_a_port_and_a_sandbox() {
        assert_eq!(
            ok("8000-sb-0a1b.sandgate.localhost"),
            (8000, "sb-0a1b".into())
        );
        assert_eq!(
            ok("8000-sb-0a1b.sandgate.localhost:7443"),
            (8000, "sb-0a1b".into())
        );
        assert_eq!(
            ok("8000-SB-0A1B.Sandgate.LOCALHOST"),
            (8000, "sb-0a1b".into())
        );
        assert_eq!(ok("65535-x.sandgate.localhost."), (65535, "x".into()));
        assert_eq!(ok("1-x.sandgate.localhost"), (1, "x".into()));
    }

    #[test]
    fn hostile_hosts_are_refused_by_name() {
        let cases: &[(&str, HostError)] = &[
            ("", HostError::Missing),
            ("0-sb-1.sandgate.localhost", HostError::BadPort),
            ("65536-sb-1.sandgate.localhost", HostError::BadPort),
            ("99999-sb-1.sandgate.localhost", HostError::BadPort),
            ("08000-sb-1.sandgate.localhost", HostError::BadPort),
            ("+80-sb-1.sandgate.localhost", HostError::BadPort),
            ("abc-sb-1.sandgate.localhost", HostError::BadPort),
            ("-sb-1.sandgate.localhost", HostError::BadPort),
            ("8000.sandgate.localhost", HostError::Malformed),
            ("8000-.sandgate.localhost", HostError::Malformed),
            ("8000-sb_1.sandgate.localhost", HostError::Malformed),
            ("8000-a.b.sandgate.localhost", HostError::Malformed),
            ("8000-sb-1.sandgate.localhost:x", HostError::Malformed),
            ("8000-sb-1.evil.test", HostError::OtherDomain),
            ("8000-sb-1.xsandgate.localhost", HostError::OtherDomain),
            ("sandgate.localhost", HostError::OtherDomain),
            ("[::1]:7443", HostError::OtherDomain),
            ("127.0.0.1:7443", HostError::OtherDomain),
        ];
        for (host, want) in cases {
            assert_eq!(parse(host, D), Err(*want), "{host:?}");
        }
        let long = format!("8000-{}.sandgate.localhost", "a".repeat(300));
        assert_eq!(parse(&long, D), Err(HostError::TooLong));
        let label = format!("8000-{}.sandgate.localhost", "a".repeat(64));
        assert_eq!(parse(&label, D), Err(HostError::Malformed));
    }
}
