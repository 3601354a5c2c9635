//! The `sandgate` binary: the CLI edge. Errors become `anyhow` here and nowhere else.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

use sandgate::config::Config;
use sandgate::server::Server;
use sandgate::tls::{CaOrigin, CertAuthority};

#[derive(Parser)]
#[command(
    name = "sandgate",
    version,
    about = "Policy-first gateway for sandboxes: placement router, layered Rego authorization, TLS-intercepting egress proxy"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create, show, list and delete sandboxes through a gateway's API (SANDGATE_URL,
    /// SANDGATE_TOKEN).
    Sandbox {
        #[command(subcommand)]
        command: sandgate::cli::SandboxCommand,
    },
    /// Explain routing offline from a configuration file's pools.
    Route {
        #[command(subcommand)]
        command: sandgate::cli::RouteCommand,
        /// TOML configuration file (its `[[providers]]`, `[[accounts]]`, `[[pools]]`).
        #[arg(long, short, env = "SANDGATE_CONFIG", global = true)]
        config: Option<PathBuf>,
    },
    /// Run the gateway (egress proxy and API) on the embedded defaults or a config file.
    Serve {
        /// TOML configuration file; without it the embedded defaults apply.
        #[arg(long, short, env = "SANDGATE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Manage the interception CA that sandboxes must trust.
    Ca {
        #[command(subcommand)]
        command: CaCommand,
        /// TOML configuration file (its `[tls] ca_dir` is used).
        #[arg(long, short, env = "SANDGATE_CONFIG", global = true)]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum CaCommand {
    /// Generate the CA if it does not exist yet, and print where it is.
    Init,
    /// Print the CA certificate (PEM) for installing into trust stores.
    Show,
    /// Print the path of the CA certificate.
    Path,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Sandbox { command } => std::process::exit(sandgate::cli::sandbox(command)?),
        Command::Route { command, config } => {
            let config = Config::load(config.as_deref()).context("invalid configuration")?;
            std::process::exit(sandgate::cli::route(command, &config)?)
        }
        Command::Serve { config } => {
            let config = Config::load(config.as_deref()).context("invalid configuration")?;
            sandgate::telemetry::init_logging(&config.log);
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            runtime.block_on(serve(config))
        }
        Command::Ca { command, config } => {
            let config = Config::load(config.as_deref()).context("invalid configuration")?;
            let dir = &config.tls.ca_dir;
            match command {
                CaCommand::Init => {
                    let (ca, origin) = CertAuthority::load_or_generate(dir)?;
                    let verb = if origin == CaOrigin::Generated {
                        "generated"
                    } else {
                        "already present"
                    };
                    println!("{} ({verb})", ca.cert_path().display());
                }
                CaCommand::Show => {
                    let ca = CertAuthority::load(dir).with_context(|| {
                        format!("no CA in {}; run `sandgate ca init`", dir.display())
                    })?;
                    print!("{}", ca.cert_pem());
                }
                CaCommand::Path => {
                    let ca = CertAuthority::load(dir).with_context(|| {
                        format!("no CA in {}; run `sandgate ca init`", dir.display())
                    })?;
                    println!("{}", ca.cert_path().display());
                }
            }
            Ok(())
        }
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let server = Server::start(config)
        .await
        .context("sandgate could not start")?;
    eprintln!(
        "sandgate: proxy on http://{} (HTTP_PROXY), API on http://{}, CA {}",
        server.proxy_addr(),
        server.api_addr(),
        server.ca_cert_path().display()
    );
    shutdown_signal().await;
    tracing::info!("shutting down");
    server.shutdown();
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
