//! E2B's protocol, spoken in both directions and kept in one place: sandgate's E2B adapter
//! (`providers::e2b`, sandgate as E2B's client) and the E2B-compatible facade (`facade`,
//! sandgate as the server the official E2B SDKs talk to) read and write the same types.
//!
//! - [`wire`]: the control plane's JSON (sandbox shapes, create and timeout bodies, the
//!   error body, the `metadata` list filter).
//! - [`connect`]: the Connect protocol's envelopes with the JSON codec, as envd speaks it.
//! - [`envd`]: envd's messages (filesystem `EntryInfo`, process events) in proto3 JSON.

pub mod connect;
pub mod envd;
pub mod wire;
