//! Every integration test of the gateway in one binary: one module per area, sharing
//! `common` (one link instead of one per file; see README "Layout").
//!
//! The tests share one process: the Prometheus recorder (`sandgate::telemetry::metrics_handle`),
//! the tracing subscriber `common::capture_logs` installs and the process's environment are
//! global. A test that asserts an exact value of an unlabelled metric gives its gateway a
//! recorder of its own (`common::own_metrics`, a `sandgate::telemetry::MetricsScope`).

mod common;

mod api_input;
mod audit;
mod aws_sigv4;
mod blaxel_fake;
mod capabilities;
mod cli;
mod cli_contract;
mod cloudflare_fake;
mod codesandbox_fake;
mod create_events;
mod credentials;
mod daytona_fake;
mod decisions_api;
mod deny_in_tunnel;
mod deploy;
mod dry_run;
mod e2b_facade;
mod e2b_fake;
mod e2b_provider;
mod egress;
mod egress_attacks;
mod egress_dns;
mod egress_fuzz;
mod egress_metadata;
mod explain_agreement;
mod floods;
mod freestyle_fake;
mod hosted_failover;
mod hosted_restart;
mod local_limits;
mod local_ports;
mod local_provider;
mod local_pty;
mod local_restart;
mod local_seccomp;
mod local_watch;
mod localbox;
mod minted_credentials;
mod modal_adapter;
mod modal_fake;
mod northflank_fake;
mod openapi;
mod policy_agreement;
mod policy_layers;
mod pools;
mod postgres_gateway;
mod prime_fake;
mod propagation;
mod provider_timeouts;
mod proxy_tls;
mod readme;
mod rekey;
mod replay;
mod replay_layers;
mod replica_failover;
mod replicas;
mod roles;
mod routing_api;
mod runloop_fake;
mod sandbox_restart;
mod sandboxes;
mod sdk_models;
mod sdk_python;
mod sdk_typescript;
mod store;
mod suggest;
mod telemetry;
mod tunnel_park;
mod tunnel_park_h2;
mod vercel_fake;
