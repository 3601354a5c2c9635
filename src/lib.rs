//! sandgate: a policy-first gateway for sandboxes.
//!
//! This crate holds the gateway's parts, kept apart by concern: `egress` (the proxy
//! protocol), `policy` (Rego), `tls` and `net` (interception CA, upstream trust, address
//! vetting), `identity`, `api`, and `server`, which wires them into one process. The
//! placement router is its own crate, `sandgate-router`.

pub mod api;
pub mod base;
pub mod callers;
pub mod cli;
pub mod config;
pub mod create;
pub mod credentials;
pub mod decision_log;
pub mod decision_ring;
pub mod demo;
pub mod domain;
pub mod e2b;
pub mod egress;
pub mod error;
pub mod facade;
pub mod identity;
pub mod localbox;
pub mod net;
pub mod operations;
pub mod ops;
pub mod policy;
pub mod ports;
pub mod propagation;
pub mod providers;
pub mod rekey;
pub mod replicas;
pub mod reply;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod tls;
