//! The `sandgate` binary: the CLI edge. Errors become `anyhow` here and nowhere else.

use std::path::PathBuf;

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand};

use sandgate::cli::{output, GatewayArgs, OutputArgs};

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
/// nothing else allocates. This thread's call purges the arenas, which all threads share.
/// A thread's own pages are another matter: `mi_collect` collects only the calling thread's
/// heap, so each proxy worker, where tunnels allocate, also collects its own every second
/// ([`release_worker_memory`], through `egress::workers::set_memory_release`).
/// A call with nothing to release costs microseconds.
fn spawn_memory_release() {
    sandgate::egress::workers::set_memory_release(release_worker_memory);
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

/// A proxy worker's collection of its own heap, forced. Why forced: in mimalloc v3
/// (`theap.c`), an unforced collection does not visit the pages it keeps as full, and a full
/// page whose blocks another thread freed stays there until its owner allocates from it or
/// visits it; an idle worker does neither. That is the reading of the allocator's source the
/// figures fit, not something observed inside the heap. Measured (`idle-tunnels`, 10,000 h2
/// tunnels, RSS 10 s after they closed over its level before; benches/README.md,
/// 2026-12-08): +8.0, +8.1, +8.7, +15.6 MiB in four runs with this, against +8.4 to +21.2
/// MiB (two of eleven over 20) without; an unforced collection on the worker gave +15.2 and
/// +15.4. No cost seen on keep-alive requests.
fn release_worker_memory() {
    #[cfg(not(feature = "system-allocator"))]
    // SAFETY: mi_collect takes no pointers and may be called from any thread.
    unsafe {
        libmimalloc_sys::mi_collect(true)
    };
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
    /// Create, show, list, run commands in and delete sandboxes through a gateway's API.
    Sandbox {
        #[command(subcommand)]
        command: sandgate::cli::SandboxCommand,
        #[command(flatten)]
        gateway: GatewayArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// List every pool of a running gateway: location, isolation, egress, free capacity,
    /// measured latency and success, recent failures and whether its account passed its
    /// last check.
    ///
    /// Examples:
    ///   sandgate pools
    ///   sandgate pools -o json | jq '.pools[].pool'
    #[command(verbatim_doc_comment)]
    Pools {
        /// The same as `-o json` (kept for scripts written before `-o`).
        #[arg(long, hide = true)]
        json: bool,
        #[command(flatten)]
        gateway: GatewayArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Store, list, show, rotate and delete a workspace's credentials: secrets sandboxes
    /// use through the proxy without ever seeing them.
    Credential {
        #[command(subcommand)]
        command: sandgate::cli::credential::CredentialCommand,
        #[command(flatten)]
        workspace: sandgate::cli::credential::WorkspaceArg,
        #[command(flatten)]
        gateway: GatewayArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Mint, list and revoke delegated capabilities: a token that lets an agent perform
    /// some of your actions on one sandbox.
    Delegation {
        #[command(subcommand)]
        command: sandgate::cli::delegation::DelegationCommand,
        #[command(flatten)]
        gateway: GatewayArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Check a configuration file without starting anything.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Print a shell completion script (bash and fish also complete sandbox ids from the
    /// gateway).
    ///
    /// Examples:
    ///   source <(sandgate completions bash)
    ///   sandgate completions zsh > "${fpath[1]}/_sandgate"
    ///   sandgate completions fish > ~/.config/fish/completions/sandgate.fish
    #[command(verbatim_doc_comment)]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff).
    ///
    /// Example:
    ///   sandgate man | man -l -
    #[command(verbatim_doc_comment)]
    Man,
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
    ///
    /// Example:
    ///   sudo ./target/debug/sandgate demo
    #[command(verbatim_doc_comment)]
    Demo,
    /// Run the gateway (egress proxy and API) on the embedded defaults or a config file.
    ///
    /// Examples:
    ///   sandgate serve
    ///   sandgate serve --config /etc/sandgate.toml --api-listen 0.0.0.0:7070
    #[command(verbatim_doc_comment)]
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
        #[arg(long, env = "SANDGATE_E2B_LISTEN", value_name = "ADDR")]
        e2b_listen: Option<std::net::SocketAddr>,
        #[command(flatten)]
        listen: ListenArgs,
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
    /// Print a running gateway's recent decisions, one line each (`-f` to follow new
    /// ones); SANDGATE_URL, SANDGATE_TOKEN.
    ///
    /// Examples:
    ///   sandgate logs --deny --since 10m
    ///   sandgate logs -f --sandbox sb-0123
    #[command(verbatim_doc_comment)]
    Logs(sandgate::cli::logs::LogsArgs),
    /// Check, test and evaluate Rego policies.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
        /// TOML configuration file (its `[policy] dir` is the default directory).
        #[arg(long, short, env = "SANDGATE_CONFIG", global = true)]
        config: Option<PathBuf>,
    },
}

/// Where `serve` listens, over the configuration's addresses.
#[derive(clap::Args)]
struct ListenArgs {
    /// The egress proxy's address (overrides `[proxy] listen`), e.g. 127.0.0.1:3128.
    #[arg(long, value_name = "ADDR")]
    listen: Option<std::net::SocketAddr>,
    /// The API's address (overrides `[api] listen`), e.g. 127.0.0.1:7070.
    #[arg(long, value_name = "ADDR")]
    api_listen: Option<std::net::SocketAddr>,
    /// The proxy's TLS listener (overrides `[proxy] tls_listen`), e.g. 0.0.0.0:3129.
    #[arg(long, value_name = "ADDR")]
    tls_listen: Option<std::net::SocketAddr>,
    /// The ports gateway's address (overrides `[ports] listen`), e.g. 127.0.0.1:7443; a
    /// failure to bind it then fails the start.
    #[arg(long, value_name = "ADDR")]
    ports_listen: Option<std::net::SocketAddr>,
}

impl ListenArgs {
    fn apply(&self, config: &mut Config) {
        if let Some(addr) = self.listen {
            config.proxy.listen = addr;
        }
        if let Some(addr) = self.api_listen {
            config.api.listen = addr;
        }
        if let Some(addr) = self.tls_listen {
            config.proxy.tls_listen = Some(addr);
        }
        if let Some(addr) = self.ports_listen {
            config.ports.listen = Some(addr);
        }
    }
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Run every check `sandgate serve` makes at start that needs no store and no port:
    /// keys and values (with "did you mean" for a misspelt key), the environment variables
    /// the file names, the pools, the accounts, the policy directory. Exit 0 valid, 2 not.
    ///
    /// Examples:
    ///   sandgate config check --config deploy/sandgate.example.toml
    ///   SANDGATE_CONFIG=/etc/sandgate.toml sandgate config check
    #[command(verbatim_doc_comment)]
    Check {
        /// The TOML configuration file [default: the embedded defaults].
        #[arg(long, short, env = "SANDGATE_CONFIG", value_name = "FILE")]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Parse and compile every policy and test file; exit 1 with file:line on error.
    ///
    /// Example:
    ///   sandgate policy check examples/policies
    #[command(verbatim_doc_comment)]
    Check {
        /// Policy directory (default: the config's `[policy] dir`).
        dir: Option<PathBuf>,
    },
    /// Run the `test_*` rules of `*_test.rego` files, like `opa test`.
    ///
    /// Examples:
    ///   sandgate policy test policies
    ///   sandgate policy test policies --run egress -v
    #[command(verbatim_doc_comment)]
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
    /// Evaluate one layer's decision for an input document (exit 0 allowed, 1 denied, 2 when
    /// the input or the policy cannot be evaluated), or replay a logged decision (`--replay
    /// ID --decisions FILE`: exit 0 when the answer is the recorded one, 1 when it differs,
    /// 2 on error).
    ///
    /// Example:
    ///   sandgate policy eval --layer egress --input request.json --dir policies
    #[command(verbatim_doc_comment)]
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
    ///
    /// Example:
    ///   sandgate policy replay --decisions decisions.jsonl --against ./candidate-policies
    #[command(verbatim_doc_comment)]
    Replay(sandgate::cli::replay::ReplayArgs),
    /// Print the narrowest data entry or Rego rule that allows a refused egress decision
    /// (host, port, method, path prefix, workspace), checked against the policy; nothing is
    /// applied. Exit 0 the check allows, 1 it still refuses, 2 on error.
    ///
    /// Example:
    ///   sandgate policy suggest 0b6f... --decisions decisions.jsonl --format rego
    #[command(verbatim_doc_comment)]
    Suggest(sandgate::cli::suggest::SuggestArgs),
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Re-seal every secret (credentials, sandbox egress tokens, the placeholder seed)
    /// under the current master key, opening them with it or an accepted key
    /// (`[secrets] accepted_key_files`, SANDGATE_ACCEPTED_MASTER_KEYS). Safe while the
    /// gateway serves; exits 1 when a value opens under none of the keys or changed meanwhile.
    ///
    /// Example:
    ///   sandgate store rekey --config /etc/sandgate.toml
    #[command(verbatim_doc_comment)]
    Rekey,
}

#[derive(Subcommand)]
enum CaCommand {
    /// Generate the CA if it does not exist yet, and print where it is.
    ///
    /// Example:
    ///   sandgate ca init --config /etc/sandgate.toml
    #[command(verbatim_doc_comment)]
    Init,
    /// Print the CA certificate (PEM) for installing into trust stores.
    ///
    /// Example:
    ///   sandgate ca show > sandgate-ca.pem
    #[command(verbatim_doc_comment)]
    Show,
    /// Print the path of the CA certificate.
    ///
    /// Example:
    ///   export SSL_CERT_FILE=$(sandgate ca path)
    #[command(verbatim_doc_comment)]
    Path,
}

fn main() {
    // regorus reports undefined values through error objects it then discards; with
    // RUST_BACKTRACE=1 (set on many hosts) each one captures a backtrace, doubling policy
    // evaluation time. Library backtraces stay off unless asked for explicitly; panics
    // still honour RUST_BACKTRACE. Set before any thread starts.
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
    let cli = Cli::parse();
    let code = run(cli).unwrap_or_else(|e| {
        // One shape for every error (sandgate::cli::output): an invalid configuration is a
        // usage error (2), anything else a failure (1).
        let (code, exit) = match invalid_config(&e) {
            true => ("invalid_config", output::USAGE),
            false => ("failed", output::FAILED),
        };
        eprint!(
            "{}",
            output::error_line(None, code, &format!("{e:#}"), &serde_json::Value::Null)
        );
        exit
    });
    std::process::exit(code);
}

/// Whether an error is the configuration's (a usage error, exit 2): an invalid file, a
/// token's unset environment variable, pools that do not compile.
fn invalid_config(e: &anyhow::Error) -> bool {
    use sandgate::server::StartError;
    e.chain().any(|c| {
        c.is::<sandgate::config::ConfigError>()
            || matches!(
                c.downcast_ref::<StartError>(),
                Some(
                    StartError::Auth(_)
                        | StartError::Routing(_)
                        | StartError::Facade(_)
                        | StartError::Credential(
                            sandgate::credentials::CredentialError::SecretSource { .. }
                        )
                )
            )
    })
}

/// Runs a command; its exit code (see `sandgate::cli::output`).
fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Sandbox {
            command,
            gateway,
            output,
        } => Ok(sandgate::cli::sandbox(command, &gateway, &output)),
        Command::Pools {
            json,
            gateway,
            output,
        } => Ok(sandgate::cli::pools(&gateway, &output, json)),
        Command::Credential {
            command,
            workspace,
            gateway,
            output,
        } => Ok(sandgate::cli::credential::credential(
            command, &workspace, &gateway, &output,
        )),
        Command::Delegation {
            command,
            gateway,
            output,
        } => Ok(sandgate::cli::delegation::delegation(
            command, &gateway, &output,
        )),
        Command::Config {
            command: ConfigCommand::Check { config },
        } => Ok(config_check(config.as_deref())),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "sandgate", &mut script);
            let script = String::from_utf8_lossy(&script).into_owned();
            emit(sandgate::cli::completions::with_ids(shell, script).as_bytes())
        }
        Command::Man => {
            let mut page = Vec::new();
            clap_mangen::Man::new(Cli::command()).render(&mut page)?;
            emit(&page)
        }
        Command::Logs(args) => {
            Ok(sandgate::cli::logs::logs(&args).unwrap_or_else(|e| e.report(args.error_format())))
        }
        Command::Route { command, config } => {
            let config = Config::load(config.as_deref()).context("invalid configuration")?;
            Ok(sandgate::cli::route(command, &config))
        }
        Command::Provider { command, config } => {
            let config = Config::load(config.as_deref()).context("invalid configuration")?;
            Ok(sandgate::cli::provider(command, &config)?)
        }
        Command::Policy { command, config } => {
            let config = Config::load(config.as_deref()).context("invalid configuration")?;
            policy_command(command, &config.policy.dir)
        }
        Command::Demo => {
            let code = runtime()?.block_on(sandgate::demo::run())?;
            Ok(code)
        }
        Command::Serve {
            config,
            role,
            e2b_listen,
            listen,
        } => {
            let mut config = Config::load(config.as_deref()).context("invalid configuration")?;
            config.role = role;
            if e2b_listen.is_some() {
                config.e2b.listen = e2b_listen;
            }
            listen.apply(&mut config);
            let traces = sandgate::telemetry::init(&config.log, &config.telemetry)?;
            let served = runtime()?.block_on(serve(config));
            // After the server stopped (SIGTERM): its last spans are flushed, not lost.
            traces.shutdown();
            served.map(|()| output::OK)
        }
        Command::Store { command, config } => {
            let config = Config::load(config.as_deref()).context("invalid configuration")?;
            match command {
                StoreCommand::Rekey => runtime()?.block_on(rekey(&config)),
            }
        }
        Command::Ca { command, config } => {
            let config = Config::load(config.as_deref()).context("invalid configuration")?;
            ca_command(command, &config.tls.ca_dir)?;
            Ok(output::OK)
        }
    }
}

/// Writes a generated document to stdout; a reader that stopped early (`| head`) is no
/// error.
fn emit(bytes: &[u8]) -> anyhow::Result<i32> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(output::OK),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// `sandgate config check`: notes on stdout, or the error on stderr and exit 2.
fn config_check(path: Option<&std::path::Path>) -> i32 {
    let checked = runtime().map_err(|e| e.to_string()).and_then(|rt| {
        rt.block_on(async { sandgate::cli::config_check::check(path) })
            .map_err(|e| e.to_string())
    });
    match checked {
        Ok(notes) => {
            for note in notes {
                println!("{note}");
            }
            output::OK
        }
        Err(message) => {
            let line =
                output::error_line(None, "invalid_config", &message, &serde_json::Value::Null);
            eprint!("{line}");
            output::USAGE
        }
    }
}

fn ca_command(command: CaCommand, dir: &std::path::Path) -> anyhow::Result<()> {
    let load = || {
        CertAuthority::load(dir)
            .with_context(|| format!("no CA in {}; run `sandgate ca init`", dir.display()))
    };
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
        CaCommand::Show => print!("{}", load()?.cert_pem()),
        CaCommand::Path => println!("{}", load()?.cert_path().display()),
    }
    Ok(())
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
            // A denial is 1; an input or policy that cannot be evaluated is 2.
            Ok(eval_input(&layer, &input, dir).unwrap_or_else(|e| {
                eprint!(
                    "{}",
                    output::error_line(
                        None,
                        "eval_failed",
                        &format!("{e:#}"),
                        &serde_json::Value::Null
                    )
                );
                output::USAGE
            }))
        }
        PolicyCommand::Suggest(args) => {
            let dir = args.dir.as_deref().unwrap_or(default_dir);
            let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
            Ok(sandgate::cli::suggest::suggest(
                &args, dir, &mut out, &mut err,
            ))
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

#[cfg(test)]
mod help_tests {
    use clap::CommandFactory;

    /// Every command of the tree with its path (`sandgate sandbox get`).
    fn walk(cmd: &clap::Command, path: String, out: &mut Vec<(String, clap::Command)>) {
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            walk(sub, format!("{path} {}", sub.get_name()), out);
        }
        out.push((path, cmd.clone()));
    }

    /// `--help` teaches: every argument says what it is, and every command that does
    /// something (a leaf) shows an example.
    #[test]
    fn every_argument_is_described_and_every_command_has_an_example() {
        let mut commands = Vec::new();
        walk(&super::Cli::command(), "sandgate".into(), &mut commands);
        let mut missing = Vec::new();
        for (path, cmd) in &commands {
            for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
                let id = arg.get_id().as_str();
                if id != "help" && id != "version" && arg.get_help().is_none() {
                    missing.push(format!("{path}: <{id}> has no description"));
                }
            }
            let leaf = cmd.get_subcommands().next().is_none();
            let about = cmd
                .get_long_about()
                .map(|a| a.to_string())
                .unwrap_or_default();
            if leaf && !about.contains("Example") {
                missing.push(format!("{path}: no example"));
            }
        }
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }
}
