//! Every integration test of the router in one binary: one module per area, sharing `common`.

mod common;

mod config;
mod explain;
mod properties;
mod seed000;
mod seed000_capabilities;
mod seed001;
