//! Headers that describe one hop only, and the request's own naming of its destination.

use http::{header, HeaderMap, HeaderName, HeaderValue, Request};

use super::decision::misdirected;
use super::target::Target;
use crate::error::{Error, Kind};

/// Removes headers that describe this hop only, plus those the Connection header names.
/// `TE: trailers` survives (gRPC needs it); an upgrade keeps `Connection`/`Upgrade`.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // Most requests carry none of these: one pass over their few names settles it, where
    // the removals below are a hash lookup each (~3.7k instructions a request in all).
    if !keep_upgrade && !headers.keys().any(is_hop_by_hop) {
        return;
    }
    strip_named(headers, keep_upgrade);
}

/// [`strip_hop_by_hop`] without its shortcut.
fn strip_named(headers: &mut HeaderMap, keep_upgrade: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .filter(|name| !(keep_upgrade && name == header::UPGRADE))
        .collect();
    for name in named {
        headers.remove(name);
    }
    let te_trailers = headers
        .get(header::TE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
        });
    for name in REMOVED {
        headers.remove(name);
    }
    if te_trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
    if !keep_upgrade {
        headers.remove(header::CONNECTION);
        headers.remove(header::UPGRADE);
    } else {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// The headers [`strip_named`] always removes (`TE: trailers` is put back).
const REMOVED: [HeaderName; 6] = [
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    header::TE,
    header::TRANSFER_ENCODING,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

/// A header [`strip_hop_by_hop`] removes or rewrites whatever it holds (those a Connection
/// header names aside: with no Connection header, there are none).
fn is_hop_by_hop(name: &HeaderName) -> bool {
    name == header::CONNECTION || name == header::UPGRADE || REMOVED.contains(name)
}

/// Host and `:authority` must name the CONNECT/URI destination: a request that names another
/// host would reach it on a connection vetted for this one (domain fronting).
pub(crate) fn check_authority<B>(req: &Request<B>, target: &Target) -> Result<(), Error> {
    let mut seen = false;
    if let Some(authority) = req.uri().authority() {
        seen = true;
        same_destination(authority.as_str(), target)?;
    }
    if let Some(host) = req.headers().get(header::HOST) {
        seen = true;
        let host = host
            .to_str()
            .map_err(|_| misdirected(target, "<non-ascii>"))?;
        same_destination(host, target)?;
    }
    if !seen {
        return Err(Error::new(
            Kind::Invalid,
            "bad_request",
            "the request names no host (Host header or :authority)",
        ));
    }
    Ok(())
}

fn same_destination(authority: &str, target: &Target) -> Result<(), Error> {
    let parsed: http::uri::Authority = authority
        .parse()
        .map_err(|_| misdirected(target, authority))?;
    let host =
        crate::domain::normalize_host(parsed.host().trim_start_matches('[').trim_end_matches(']'));
    if host != target.host {
        return Err(misdirected(target, authority));
    }
    if let Some(port) = parsed.port_u16() {
        if port != target.port {
            return Err(misdirected(target, authority));
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "hop_tests.rs"]
mod tests;
