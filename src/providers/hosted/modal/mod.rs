//! The Modal adapter: sandboxes through Modal's gRPC API, as the official SDK `modal` 1.6.4
//! (PyPI) speaks it.

pub mod proto;
