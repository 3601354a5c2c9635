//! The `sandgate` binary: the CLI edge. Errors become `anyhow` here and nowhere else.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

use sandgate::config::Config;
use sandgate::server::Server;
use sandgate::tls::{CaOrigin, CertAuthority};

/// mimalloc rather than the system allocator: the proxy allocates and frees small objects
/// per request (headers, policy inputs, bodies' frames), and glibc malloc/free were ~17% of
/// its CPU in the keep-alive benchmark (see benches/README.md). Built without transparent
/// huge pages (`libmimalloc-sys` feature `no_thp`): mimalloc otherwise asks for them on its
/// arenas, and with the kernel's THP in `madvise` mode every touched 2 MiB region became
/// resident, 15 MiB more at start and a third more per idle tunnel (the `idle-tunnels`
/// bench's figures).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Returns freed memory to the OS every second. mimalloc releases freed pages only from inside
/// later allocator calls, so an idle gateway kept what 10k closed tunnels had used (548 MiB
/// after they closed, against 50 MiB with this; see the `idle-tunnels` scenario in
/// benches/README.md), and tunnels that park (`egress::park`) free their HTTP buffers when
/// nothing else allocates. One call releases the pages of every thread: the arenas are
/// shared; a call with nothing to release costs microseconds.
fn spawn_memory_release() {
    let _ = std::thread::Builder::new()
        .name("sandgate-mem-release".into())
        .spawn(|| loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
            #[cfg(not(feature = "system-allocator"))]
            // SAFETY: mi_collect takes no pointers and may be called from any thread.
            unsafe {
                libmimalloc_sys::mi_collect(false)
            };
        });
}

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
    /// List every pool of a running gateway (SANDGATE_URL, SANDGATE_TOKEN): location,
    /// isolation, egress, free capacity, measured latency and success, recent failures and
    /// whether its account passed its last check.
    Pools {
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Explain routing on a configuration's pools and the measured context of its store (or
    /// of a running gateway with `--url`).
    Route {
        #[command(subcommand)]
        command: sandgate::cli::RouteCommand,
        /// TOML configuration file (its `[[providers]]`, `[[accounts]]`, `[[pools]]`).
        #[arg(long, short, env = "SANDGATE_CONFIG", global = true)]
        config: Option<PathBuf>,
    },
    /// Check hosted provider accounts from a configuration file's `[[accounts]]`.
    Provider {
        #[command(subcommand)]
        command: sandgate::cli::ProviderCommand,
        /// TOML configuration file.
        #[arg(long, short, env = "SANDGATE_CONFIG", global = true)]
        config: Option<PathBuf>,
    },
    /// Show sandgate end to end in one command (no network, no account; needs root): a
    /// local sandbox, an allowed and a blocked HTTPS origin, an injected credential, and no
    /// route around the proxy.
    Demo,
    /// Run the gateway (egress proxy and API) on the embedded defaults or a config file.
    Serve {
        /// TOML configuration file; without it the embedded defaults apply.
        #[arg(long, short, env = "SANDGATE_CONFIG")]
        config: Option<PathBuf>,
        /// What this replica serves: `all` (proxy, API and creates), `api` (the control
        /// plane, no proxy listener) or `proxy` (the egress proxy; its API listener answers
        /// only /livez, /readyz, /healthz and /metrics).
        #[arg(long, value_enum, env = "SANDGATE_ROLE", default_value = "all")]
        role: sandgate::config::Role,
        /// Serve the E2B-compatible API here (overrides `[e2b] listen`); point the E2B SDKs'
        /// `E2B_API_URL` and `E2B_SANDBOX_URL` at it.
        #[arg(long, env = "SANDGATE_E2B_LISTEN")]
        e2b_listen: Option<std::net::SocketAddr>,
    },
    /// Manage the interception CA that sandboxes must trust.
    Ca {
        #[command(subcommand)]
        command: CaCommand,
        /// TOML configuration file (its `[tls] ca_dir` is used).
        #[arg(long, short, env = "SANDGATE_CONFIG", global = true)]
        config: Option<PathBuf>,
    },
    /// Maintain the store a configuration names.
    Store {
        #[command(subcommand)]
        command: StoreCommand,
        /// TOML configuration file (its `[store]` and `[secrets]`).
        #[arg(long, short, env = "SANDGATE_CONFIG", global = true)]
        config: Option<PathBuf>,
    },
    /// Check, test and evaluate Rego policies.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
        /// TOML configuration file (its `[policy] dir` is the default directory).
        #[arg(long, short, env = "SANDGATE_CONFIG", global = true)]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Parse and compile every policy and test file; exit 1 with file:line on error.
    Check {
        /// Policy directory (default: the config's `[policy] dir`).
        dir: Option<PathBuf>,
    },
    /// Run the `test_*` rules of `*_test.rego` files, like `opa test`.
    Test {
        /// Policy directory (default: the config's `[policy] dir`).
        dir: Option<PathBuf>,
        /// Only tests whose `package.rule` name contains this.
        #[arg(long)]
        run: Option<String>,
        /// Print every test, not only failures.
        #[arg(long, short)]
        verbose: bool,
    },
    /// Evaluate one layer's decision for an input document, or replay a logged decision
    /// (`--replay ID --decisions FILE`: exit 0 when the answer is the recorded one, 1 when it
    /// differs, 2 on error).
    Eval {
        /// The layer (package `sandgate.<layer>`), e.g. egress or credential.
        #[arg(long, required_unless_present = "replay")]
        layer: Option<String>,
        /// JSON input document (`-` for standard input).
        #[arg(long, required_unless_present = "replay")]
        input: Option<PathBuf>,
        /// Policy directory (default: the config's `[policy] dir`).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// A logged decision's `decision_id`: evaluate its recorded input instead.
        #[arg(long, conflicts_with_all = ["layer", "input"], requires = "decisions")]
        replay: Option<String>,
        /// The decision log to find `--replay`'s record in (JSON lines, `[log] decisions`).
        #[arg(long)]
        decisions: Option<PathBuf>,
    },
    /// Evaluate every decision of a log under a candidate policy directory and report what
    /// flips (allow→deny, deny→allow): exit 0 when nothing flips, 1 when something does.
    Replay(sandgate::cli::replay::ReplayArgs),
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Re-seal every secret (credentials, sandbox egress tokens, the placeholder seed)
    /// under the current master key, opening them with it or an accepted key
    /// (`[secrets] accepted_key_files`, SANDGATE_ACCEPTED_MASTER_KEYS). Safe while the
    /// gateway serves; exits 1 when a value opens under none of the keys or changed meanwhile.
    Rekey,
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
    // regorus reports undefined values through error objects it then discards; with
    // RUST_BACKTRACE=1 (set on many hosts) each one captures a backtrace, doubling policy
    // evaluation time. Library backtraces stay off unless asked for explicitly; panics
    // still honour RUST_BACKTRACE. Set before any thread starts.
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Sandbox { command } => std::process::exit(sandgate::cli::sandbox(command)?),
        Command::Pools { json } => std::process::exit(sandgate::cli::pools(json)?),
        Command::Route { command, config } => {
            let config = Config::load(config.as_deref()).context("invalid configuration")?;
            std::process::exit(sandgate::cli::route(command, &config)?)
        }
        Command::Provider { command, config } => {
            let config = Config::load(config.as_deref()).context("invalid configuration")?;
            std::process::exit(sandgate::cli::provider(command, &config)?)
        }
        Command::Policy { command, config } => {
            let config = Config::load(config.as_deref()).context("invalid configuration")?;
            let code = policy_command(command, &config.policy.dir)?;
            std::process::exit(code);
        }
        Command::Demo => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            let code = runtime.block_on(sandgate::demo::run())?;
            std::process::exit(code);
        }
        Command::Serve {
            config,
            role,
            e2b_listen,
        } => {
            let mut config = Config::load(config.as_deref()).context("invalid configuration")?;
            config.role = role;
            if e2b_listen.is_some() {
                config.e2b.listen = e2b_listen;
            }
            sandgate::telemetry::init_logging(&config.log);
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            runtime.block_on(serve(config))
        }
        Command::Store { command, config } => {
            let config = Config::load(config.as_deref()).context("invalid configuration")?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            let code = match command {
                StoreCommand::Rekey => runtime.block_on(rekey(&config))?,
            };
            std::process::exit(code);
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

fn policy_command(command: PolicyCommand, default_dir: &std::path::Path) -> anyhow::Result<i32> {
    use sandgate::policy::testing::{self, Outcome};
    match command {
        PolicyCommand::Check { dir } => {
            let dir = dir.as_deref().unwrap_or(default_dir);
            match testing::check(dir) {
                Ok(files) => {
                    println!("{} files compile", files.len());
                    Ok(0)
                }
                Err(e) => {
                    eprintln!("{e}");
                    Ok(1)
                }
            }
        }
        PolicyCommand::Test { dir, run, verbose } => {
            let dir = dir.as_deref().unwrap_or(default_dir);
            let report = match testing::run(dir, run.as_deref()) {
                Ok(report) => report,
                Err(e) => {
                    eprintln!("{e}");
                    return Ok(2);
                }
            };
            for result in &report.results {
                let line = match &result.outcome {
                    Outcome::Pass if !verbose => continue,
                    Outcome::Pass => format!("PASS: {} ({:?})", result.name, result.duration),
                    Outcome::Fail => format!("FAIL: {} ({})", result.name, result.file),
                    Outcome::Error(e) => format!("ERROR: {} ({})\n  {e}", result.name, result.file),
                };
                println!("{line}");
            }
            println!("{} passed, {} failed", report.passed(), report.failed());
            Ok(if report.failed() == 0 && !report.results.is_empty() {
                0
            } else {
                1
            })
        }
        PolicyCommand::Eval {
            replay: Some(id),
            decisions,
            dir,
            ..
        } => {
            let dir = dir.as_deref().unwrap_or(default_dir);
            let decisions = decisions.context("--replay needs --decisions FILE")?;
            let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
            Ok(sandgate::cli::replay::eval_replay(
                &id, &decisions, dir, &mut out, &mut err,
            ))
        }
        PolicyCommand::Eval {
            layer, input, dir, ..
        } => {
            let dir = dir.as_deref().unwrap_or(default_dir);
            let (Some(layer), Some(input)) = (layer, input) else {
                anyhow::bail!("--layer and --input are needed unless --replay is given");
            };
            eval_input(&layer, &input, dir)
        }
        PolicyCommand::Replay(args) => {
            let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
            Ok(sandgate::cli::replay::replay_against(
                &args, &mut out, &mut err,
            ))
        }
    }
}

/// `policy eval --layer L --input FILE`: one decision for a given input document.
fn eval_input(layer: &str, input: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<i32> {
    let text = if input.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(input).with_context(|| format!("reading {}", input.display()))?
    };
    let value = regorus::Value::from_json_str(&text).context("the input is not JSON")?;
    let engine = sandgate::policy::PolicyEngine::load(dir)?;
    let layer: sandgate::policy::Layer = layer.parse()?;
    let scopes = engine.scopes_for(layer.as_str(), &value);
    let decision = engine.decide(layer, value);
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({
            "layer": layer,
            "allowed": decision.allowed,
            "reasons": decision.reasons,
            "action": decision.action,
            "scopes": scopes,
            "deny_scope": decision.deny_scope.as_deref(),
            "eval_us": decision.eval_time.as_micros() as u64,
        }))?
    );
    Ok(if decision.allowed { 0 } else { 1 })
}

async fn rekey(config: &Config) -> anyhow::Result<i32> {
    use sandgate::credentials::seal::MasterKey;
    if config.store.url.is_none() && !config.store.path.exists() {
        anyhow::bail!(
            "no store at {}: nothing to re-seal",
            config.store.path.display()
        );
    }
    let store = sandgate::store::Store::open(&config.store)
        .await
        .context("opening the store")?;
    let key = MasterKey::load_ring(
        &config.secrets.master_key_file,
        &config.secrets.accepted_key_files,
    )
    .context("loading the master keys")?;
    eprintln!(
        "rekey: {} at {}, sealing under the current key ({} accepted besides)",
        match store.dialect() {
            sandgate::store::Dialect::Sqlite => "SQLite",
            sandgate::store::Dialect::Postgres => "Postgres",
        },
        store.location(),
        key.key_count() - 1
    );
    let report = sandgate::rekey::rekey(&store, &key, |line| println!("{line}")).await?;
    for row in &report.unreadable {
        eprintln!("rekey: {row}: opens under none of the keys; add its key to accepted_key_files");
    }
    if report.complete() {
        println!("every secret is sealed under the current key");
        Ok(0)
    } else {
        eprintln!("rekey: not complete; run it again once the values above can be opened");
        Ok(1)
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    spawn_memory_release();
    let (limit, needed) = sandgate::server::descriptor_budget(&config);
    if limit < needed {
        tracing::warn!(
            limit,
            needed,
            "the descriptor limit (ulimit -n) is below what [proxy] max_connections and [api] max_connections can use; \
             raise it or lower them, or a flood can exhaust descriptors before those limits shed it"
        );
    }
    let role = config.role;
    let server = Server::start(config)
        .await
        .context("sandgate could not start")?;
    let proxy_note = if role.serves_proxy() {
        "(HTTP_PROXY)"
    } else {
        "(not served by this replica)"
    };
    eprintln!(
        "sandgate: proxy on http://{} {proxy_note}, API on http://{}, CA {}, role {}",
        server.proxy_addr(),
        server.api_addr(),
        server.ca_cert_path().display(),
        role.as_str()
    );
    shutdown_signal().await;
    tracing::info!("shutting down");
    server.stop().await;
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
