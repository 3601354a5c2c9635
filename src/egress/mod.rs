//! The egress proxy: the only way out of a sandbox.
//!
//! Request path (see DESIGN "Egress request path"), one module per step:
//! - [`accept`]: accept (bounded; shed with 503), one HTTP/1.1 server per client;
//! - [`connect`]: identify the sandbox from `Proxy-Authorization` (or the listener), 407
//!   otherwise; take the destination from the CONNECT authority or the absolute URI, never
//!   from a Host header; a destination name carrying a placeholder is refused unresolved;
//!   egress policy on the name (a refused name is never resolved, except as [`by_address`]
//!   says for a sandbox given `network.cidrs`); resolve once and vet every address with its
//!   real port;
//! - [`tunnel`]: for CONNECT, sniff the tunnel: TLS is terminated with a minted leaf (SNI
//!   must equal the CONNECT host), plain HTTP is served as is, and anything else passes only
//!   when the policy's action is `tunnel`; the tunnel ends when its identity is revoked;
//!   a refused destination is answered inside the tunnel instead ([`deny_tunnel`]), so the
//!   client shows the reason, or on the CONNECT (`deny_mode = "connect"`);
//! - [`forward`]: every request inside, as named phases (admit, request policy, resolve,
//!   credentials, upstream request, response);
//! - [`upstream`]: pooled upstream connections that dial exactly the vetted addresses.
//!
//! Threads: the proxy listener is served by `workers` (one single-threaded runtime per
//! core); see that module for why.
//!
//! Transports: the plain listener, and the TLS listener ([`tls_listener`], its certificate
//! in [`tls_cert`]) for sandboxes that reach sandgate across a network; past the handshake
//! both are the same proxy.

mod accept;
mod body;
pub(crate) mod by_address;
pub mod config;
mod connect;
mod decision;
mod deny_tunnel;
mod forward;
mod h2_wire;
mod hop;
mod io;
mod limits;
mod park;
mod park_h2;
pub mod path;
mod state;
mod target;
mod tls_cert;
mod tls_listener;
mod tunnel;
mod upstream;
mod websocket;
pub mod workers;

pub use accept::{serve, serve_for};
pub use body::{BoxError, ProxyBody};
pub use state::{EgressDeps, EgressState};
pub use tls_cert::{server_config as tls_server_config, ListenerCertError};
pub use tls_listener::serve_tls;
pub(crate) use websocket::is_upgrade;
