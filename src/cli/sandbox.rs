//! `sandgate sandbox ...`: create, show, list, delete and operate sandboxes through a
//! gateway's API, printed by the output contract of [`super::output`].

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::Value;

use super::output::{self, OutputArgs, Shape, FAILED, NOT_FOUND};
use super::{encode, read_json, shapes, wait, why, Api, CliError};

#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Create a sandbox from a JSON create request (the body of `POST /v1/sandboxes`).
    ///
    /// Examples:
    ///   sandgate sandbox create
    ///   echo '{"labels": {"team": "a"}, "ttl_secs": 600}' | sandgate sandbox create -f - --wait
    ///   id=$(sandgate sandbox create -q)
    #[command(verbatim_doc_comment)]
    Create {
        /// The request body: a JSON file, or `-` for standard input [default: `{}`, the
        /// default pool's default sandbox].
        #[arg(long, short, value_name = "FILE")]
        file: Option<PathBuf>,
        /// Idempotency key: repeating a create with the same key returns the same sandbox
        /// instead of making a second one.
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
        /// Follow the create to its end (`GET /v1/sandboxes/{id}/events`): each attempt as it
        /// happens on stderr (a live spinner on a terminal, one plain line per event
        /// otherwise), then the final sandbox on stdout; exit 1 with the reason when it
        /// failed.
        #[arg(long)]
        wait: bool,
        /// Only plan the create: sends `"dry_run": true` in the body and prints the plan
        /// (`--wait` is ignored; the plan prints as JSON or YAML, it has no table).
        #[arg(long)]
        dry_run: bool,
    },
    /// Show a sandbox: state, placement, age, labels (`-o json` for everything: attempts,
    /// egress settings, limits).
    ///
    /// Examples:
    ///   sandgate sandbox get sb-0123
    ///   sandgate sandbox get sb-0123 --why
    #[command(verbatim_doc_comment)]
    Get {
        /// The sandbox id (`sb-…`).
        id: String,
        /// Explain the placement instead: the routing record kept when the create was
        /// accepted (every pool's eligibility, unmet requirements, rank keys and measured
        /// values then) next to the attempts, as a table.
        #[arg(long)]
        why: bool,
    },
    /// List the sandboxes of a workspace, newest first.
    ///
    /// Examples:
    ///   sandgate sandbox list --state running
    ///   sandgate sandbox list --label team=a -q | xargs -n1 sandgate sandbox delete
    #[command(verbatim_doc_comment)]
    List {
        /// The workspace to list [default: the token's own workspace; another needs the
        /// admin role].
        #[arg(long, value_name = "NAME")]
        workspace: Option<String>,
        /// Only sandboxes in this state.
        #[arg(long, value_parser = STATES)]
        state: Option<String>,
        /// Only sandboxes with this label, `key=value`.
        #[arg(long, value_name = "KEY=VALUE")]
        label: Option<String>,
        /// At most this many sandboxes (one page) [default: the server's, 100].
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
        /// Continue after the previous page: its `next_cursor` (a table prints it on stderr).
        #[arg(long, value_name = "CURSOR")]
        cursor: Option<String>,
    },
    /// Delete a sandbox: its instance is destroyed and its proxy identity revoked at once.
    /// A sandbox that was already deleted is reported (`already_deleted`, exit 3).
    ///
    /// Example:
    ///   sandgate sandbox delete sb-0123
    #[command(verbatim_doc_comment)]
    Delete {
        /// The sandbox id.
        id: String,
    },
    /// Run a command in a sandbox: its output streams to this terminal's stdout and
    /// stderr, and sandgate exits with the command's exit code (128+N when killed by signal
    /// N, 124 on timeout, 125 when the API refused or failed).
    ///
    /// Examples:
    ///   sandgate sandbox exec sb-0123 -- uname -a
    ///   sandgate sandbox exec sb-0123 --cwd /tmp -e DEBUG=1 --timeout 30 -- sh -c 'make test'
    ///   sandgate sandbox exec sb-0123 --user root -- apt-get install -y jq
    #[command(verbatim_doc_comment)]
    Exec {
        /// The sandbox id.
        id: String,
        /// Working directory inside the sandbox [default: the sandbox's home].
        #[arg(long, value_name = "DIR")]
        cwd: Option<String>,
        /// Extra environment variable, `KEY=VALUE` (repeatable).
        #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// Kill the command after this many seconds (exit 124).
        #[arg(long, value_name = "SECS")]
        timeout: Option<u64>,
        /// Run as this user, one the sandbox's pool declares (`sandgate pools` shows a
        /// local pool's in its `sandgate.users` label) [default: the pool's default user].
        #[arg(long, short = 'u', value_name = "NAME")]
        user: Option<String>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "COMMAND")]
        argv: Vec<String>,
    },
    /// Open an interactive shell (or COMMAND) in a sandbox on a terminal of its own, sized
    /// and resized like this one; Ctrl-C goes to the command. sandgate exits with its exit
    /// code (128+N when killed by signal N, 125 when the API refused or failed); this
    /// terminal is restored on exit. Needs the `pty` action.
    ///
    /// Examples:
    ///   sandgate sandbox shell sb-0123
    ///   sandgate sandbox shell sb-0123 --cwd /tmp -- python3
    #[command(verbatim_doc_comment)]
    Shell {
        /// The sandbox id.
        id: String,
        /// Working directory inside the sandbox [default: the sandbox's home].
        #[arg(long, value_name = "DIR")]
        cwd: Option<String>,
        /// Extra environment variable, `KEY=VALUE` (repeatable; `TERM` is this terminal's
        /// unless given).
        #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// Run as this user, one the sandbox's pool declares [default: the pool's default
        /// user].
        #[arg(long, short = 'u', value_name = "NAME")]
        user: Option<String>,
        /// The command and its arguments, after `--` [default: bash if the sandbox has it,
        /// else sh].
        #[arg(last = true, value_name = "COMMAND")]
        argv: Vec<String>,
    },
    /// Show the URL of a port the sandbox serves, reached through the gateway's ports
    /// listener, whether it is public, and its token (send it as X-Sandgate-Port-Token).
    /// Needs the `ports` action. With `-q`, only the URL.
    ///
    /// Examples:
    ///   sandgate sandbox port sb-0123 8000
    ///   curl --cacert certs/ca.pem -H "X-Sandgate-Port-Token: $TOKEN" "$(sandgate sandbox port sb-0123 8000 -q)"
    #[command(verbatim_doc_comment)]
    Port {
        /// The sandbox id.
        id: String,
        /// The port inside the sandbox (1 to 65535).
        port: u16,
    },
    /// Watch a directory of a sandbox: one line per change (`create`, `write`, `remove`,
    /// `rename`, `chmod` and the path below the directory; with `-o json` one JSON object
    /// per line) until the watch ends (the sandbox stops or is deleted) or Ctrl-C. Needs
    /// the `watch` action.
    ///
    /// Examples:
    ///   sandgate sandbox watch sb-0123 /home/user
    ///   sandgate sandbox watch sb-0123 /home/user/project --recursive -o json
    #[command(verbatim_doc_comment)]
    Watch {
        /// The sandbox id.
        id: String,
        /// The directory (absolute, or relative to the sandbox's home).
        path: String,
        /// Watch the directories below it too, including those created later.
        #[arg(long, short = 'r')]
        recursive: bool,
    },
    /// Stop a sandbox: every process is killed, files stay.
    ///
    /// Example:
    ///   sandgate sandbox stop sb-0123
    #[command(verbatim_doc_comment)]
    Stop {
        /// The sandbox id.
        id: String,
    },
    /// Start a stopped sandbox.
    ///
    /// Example:
    ///   sandgate sandbox start sb-0123
    #[command(verbatim_doc_comment)]
    Start {
        /// The sandbox id.
        id: String,
    },
    /// Pause a sandbox (freeze every process).
    ///
    /// Example:
    ///   sandgate sandbox pause sb-0123
    #[command(verbatim_doc_comment)]
    Pause {
        /// The sandbox id.
        id: String,
    },
    /// Resume a paused sandbox.
    ///
    /// Example:
    ///   sandgate sandbox resume sb-0123
    #[command(verbatim_doc_comment)]
    Resume {
        /// The sandbox id.
        id: String,
    },
    /// Snapshot a sandbox's files (create from it with `"snapshot": "<id>"`); `-q` prints
    /// the snapshot id.
    ///
    /// Example:
    ///   sandgate sandbox snapshot sb-0123
    #[command(verbatim_doc_comment)]
    Snapshot {
        /// The sandbox id.
        id: String,
    },
    /// Files of a sandbox: read, write, ls, rm, mkdir.
    #[command(subcommand)]
    Files(FilesCommand),
}

/// The states `--state` accepts (the API's).
const STATES: [&str; 8] = [
    "pending",
    "provisioning",
    "reconciling",
    "running",
    "paused",
    "stopped",
    "failed",
    "deleted",
];

#[derive(Debug, Subcommand)]
pub enum FilesCommand {
    /// Print a file's bytes on stdout.
    ///
    /// Example:
    ///   sandgate sandbox files read sb-0123 /home/user/out.txt > out.txt
    #[command(verbatim_doc_comment)]
    Read {
        /// The sandbox id.
        id: String,
        /// The file's absolute path inside the sandbox.
        path: String,
    },
    /// Write a file from a local file (or standard input with `-`).
    ///
    /// Example:
    ///   sandgate sandbox files write sb-0123 /home/user/in.txt --from in.txt
    #[command(verbatim_doc_comment)]
    Write {
        /// The sandbox id.
        id: String,
        /// The file's absolute path inside the sandbox (replaced when it exists).
        path: String,
        /// Local source; `-` for standard input.
        #[arg(long, default_value = "-", value_name = "FILE")]
        from: PathBuf,
    },
    /// List a directory: mode, size, modification time, name.
    ///
    /// Example:
    ///   sandgate sandbox files ls sb-0123 /home/user
    #[command(verbatim_doc_comment)]
    Ls {
        /// The sandbox id.
        id: String,
        /// The directory's absolute path inside the sandbox.
        path: String,
    },
    /// Delete a file or (with `-r`) a directory tree.
    ///
    /// Example:
    ///   sandgate sandbox files rm sb-0123 /home/user/build -r
    #[command(verbatim_doc_comment)]
    Rm {
        /// The sandbox id.
        id: String,
        /// The absolute path inside the sandbox.
        path: String,
        /// Delete a directory and everything in it.
        #[arg(short = 'r', long)]
        recursive: bool,
    },
    /// Create a directory (with its parents with `-p`).
    ///
    /// Example:
    ///   sandgate sandbox files mkdir sb-0123 /home/user/a/b -p
    #[command(verbatim_doc_comment)]
    Mkdir {
        /// The sandbox id.
        id: String,
        /// The directory's absolute path inside the sandbox.
        path: String,
        /// Create missing parent directories too; an existing directory is no error.
        #[arg(short = 'p', long)]
        parents: bool,
    },
}

/// `sandgate sandbox ...`; returns the exit code (see [`super::output`]).
pub(super) async fn run(api: &Api, out: &OutputArgs, cmd: SandboxCommand) -> Result<i32, CliError> {
    let sandbox = &shapes::SANDBOX;
    let (status, body) = match cmd {
        SandboxCommand::Create {
            file,
            idempotency_key,
            wait,
            dry_run,
        } => return create(api, out, file, idempotency_key, wait, dry_run).await,
        SandboxCommand::Get { id, why: true } => return get_why(api, out, &id).await,
        SandboxCommand::Get { id, .. } => get(api, &id).await?,
        SandboxCommand::List {
            workspace,
            state,
            label,
            limit,
            cursor,
        } => {
            let query = [
                ("workspace", workspace),
                ("state", state),
                ("label", label),
                ("limit", limit.map(|l| l.to_string())),
                ("cursor", cursor),
            ];
            return list(api, out, &query).await;
        }
        SandboxCommand::Delete { id } => return delete(api, out, &id).await,
        SandboxCommand::Exec {
            id,
            cwd,
            env,
            timeout,
            user,
            argv,
        } => {
            let options = super::exec::ExecOptions {
                cwd,
                env,
                timeout,
                user,
                argv,
            };
            return super::exec::exec(api, out, &id, options).await;
        }
        SandboxCommand::Shell {
            id,
            cwd,
            env,
            user,
            argv,
        } => {
            let options = super::shell::SessionOptions {
                cwd,
                env,
                user,
                argv,
            };
            return super::shell::shell(api, out, &id, options).await;
        }
        SandboxCommand::Port { id, port } => {
            let url = format!("{}/v1/sandboxes/{}/ports/{port}", api.base, encode(&id));
            let (status, body) = api.send(api.http.get(&url), &url).await?;
            return Ok(reply(out, status, &body, &shapes::PORT));
        }
        SandboxCommand::Watch {
            id,
            path,
            recursive,
        } => return super::watch::watch(api, out, &id, &path, recursive).await,
        SandboxCommand::Stop { id } => lifecycle(api, &id, "stop").await?,
        SandboxCommand::Start { id } => lifecycle(api, &id, "start").await?,
        SandboxCommand::Pause { id } => lifecycle(api, &id, "pause").await?,
        SandboxCommand::Resume { id } => lifecycle(api, &id, "resume").await?,
        SandboxCommand::Snapshot { id } => {
            let (status, body) = lifecycle(api, &id, "snapshot").await?;
            return Ok(reply(out, status, &body, &shapes::SNAPSHOT));
        }
        SandboxCommand::Files(files) => return super::files::run(api, out, files).await,
    };
    Ok(reply(out, status, &body, sandbox))
}

/// Prints an API answer by the contract: a 2xx body on stdout in the chosen format, an
/// error on stderr; returns the exit code.
pub(super) fn reply(out: &OutputArgs, status: u16, body: &Value, shape: &Shape) -> i32 {
    if !(200..300).contains(&status) {
        eprint!("{}", output::api_error(out.output, status, body));
        return output::exit_code(status);
    }
    print!("{}", output::render(out.format(), out.quiet, body, shape));
    output::OK
}

async fn get(api: &Api, id: &str) -> Result<(u16, Value), CliError> {
    let url = format!("{}/v1/sandboxes/{}", api.base, encode(id));
    api.send(api.http.get(&url), &url).await
}

async fn get_why(api: &Api, out: &OutputArgs, id: &str) -> Result<i32, CliError> {
    let (status, body) = get(api, id).await?;
    if status != 200 {
        return Ok(reply(out, status, &body, &shapes::SANDBOX));
    }
    print!("{}", why::render(&body));
    Ok(output::OK)
}

async fn lifecycle(api: &Api, id: &str, op: &str) -> Result<(u16, Value), CliError> {
    let url = format!("{}/v1/sandboxes/{}/{op}", api.base, encode(id));
    api.send(api.http.post(&url), &url).await
}

async fn create(
    api: &Api,
    out: &OutputArgs,
    file: Option<PathBuf>,
    idempotency_key: Option<String>,
    wait: bool,
    dry_run: bool,
) -> Result<i32, CliError> {
    let mut body = match &file {
        Some(path) => read_json(path)?,
        None => Value::Object(Default::default()),
    };
    if dry_run {
        let Some(fields) = body.as_object_mut() else {
            return Err(CliError::Usage(
                "--dry-run needs the request body to be a JSON object".into(),
            ));
        };
        fields.insert("dry_run".into(), Value::Bool(true));
    }
    let url = format!("{}/v1/sandboxes", api.base);
    let mut req = api.http.post(&url).json(&body);
    if let Some(key) = &idempotency_key {
        req = req.header("idempotency-key", key);
    }
    let (status, created) = api.send(req, &url).await?;
    if dry_run {
        return Ok(reply(out, status, &created, &shapes::DOCUMENT));
    }
    if !wait {
        return Ok(reply(out, status, &created, &shapes::SANDBOX));
    }
    let (status, done) = wait::follow(api, status, created).await?;
    if status == 500 && done["id"].is_string() {
        // The create failed: its reason is on stderr already; the sandbox (state `failed`,
        // its attempts) is still the answer.
        reply(out, 200, &done, &shapes::SANDBOX);
        return Ok(FAILED);
    }
    Ok(reply(out, status, &done, &shapes::SANDBOX))
}

async fn list(
    api: &Api,
    out: &OutputArgs,
    query: &[(&str, Option<String>)],
) -> Result<i32, CliError> {
    let mut url = format!("{}/v1/sandboxes", api.base);
    let mut sep = '?';
    for (k, v) in query {
        if let Some(v) = v {
            url.push_str(&format!("{sep}{k}={}", encode(v)));
            sep = '&';
        }
    }
    let (status, body) = api.send(api.http.get(&url), &url).await?;
    let code = reply(out, status, &body, &shapes::SANDBOX_LIST);
    let tabular = matches!(out.format(), output::Format::Table | output::Format::Wide);
    if let (Some(next), true) = (body["next_cursor"].as_str(), code == output::OK && tabular) {
        eprintln!("more: --cursor {}", super::term::clean(next));
    }
    Ok(code)
}

/// Deletes; a sandbox already deleted is reported as `already_deleted` (exit 3): the API
/// answers every delete of a known id with the deleted sandbox, so the state is read first.
async fn delete(api: &Api, out: &OutputArgs, id: &str) -> Result<i32, CliError> {
    let (status, before) = get(api, id).await?;
    if status == 200 && before["state"] == "deleted" {
        let details = serde_json::json!({"sandbox_id": id});
        let message = format!("sandbox {id} was already deleted");
        eprint!(
            "{}",
            output::error_line(out.output, "already_deleted", &message, &details)
        );
        return Ok(NOT_FOUND);
    }
    let url = format!("{}/v1/sandboxes/{}", api.base, encode(id));
    let (status, body) = api.send(api.http.delete(&url), &url).await?;
    Ok(reply(out, status, &body, &shapes::SANDBOX))
}
