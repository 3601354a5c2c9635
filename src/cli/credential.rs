//! `sandgate credential create|list|get|rotate|delete`: a workspace's credentials through
//! `/v1/workspaces/{ws}/credentials`. A secret is read from standard input or a file, never
//! from the command line (where `ps` and shell history would keep it), and never printed:
//! the API answers with metadata only.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use clap::Subcommand;
use serde_json::{json, Value};

use super::output::{cell, list_of, single, OutputArgs, Shape};
use super::sandbox::reply;
use super::{encode, read_json, run_client, Api, CliError, GatewayArgs};

#[derive(Debug, Subcommand)]
pub enum CredentialCommand {
    /// Store a credential: where it may be used and how it is put on requests; the secret
    /// comes from standard input or `--secret-file`. Sandboxes see only a placeholder.
    ///
    /// Examples:
    ///   printf %s "$GITHUB_TOKEN" | sandgate credential create github --host api.github.com \
    ///       --header 'Authorization: Bearer {secret}' --placeholder-env GITHUB_TOKEN
    ///   sandgate credential create api -f credential.json --secret-file ./api.key
    #[command(verbatim_doc_comment)]
    Create {
        /// The credential's name: 1-64 of a-z, 0-9, '-', '_', '.'.
        name: String,
        #[command(flatten)]
        definition: Definition,
        /// Read the secret from this file instead of standard input (a final newline is
        /// dropped).
        #[arg(long, value_name = "FILE")]
        secret_file: Option<PathBuf>,
    },
    /// List a workspace's credentials (metadata only).
    ///
    /// Example:
    ///   sandgate credential list -o wide
    #[command(verbatim_doc_comment)]
    List,
    /// Show one credential: destinations, how it is applied, version, token status.
    ///
    /// Example:
    ///   sandgate credential get github -o yaml
    #[command(verbatim_doc_comment)]
    Get {
        /// The credential's name.
        name: String,
    },
    /// Replace a credential's secret (from standard input or `--secret-file`), keeping its
    /// destinations and how it is applied; sandboxes keep their placeholder.
    ///
    /// Example:
    ///   sandgate credential rotate github --secret-file ./new-token
    #[command(verbatim_doc_comment)]
    Rotate {
        /// The credential's name.
        name: String,
        /// Read the new secret from this file instead of standard input.
        #[arg(long, value_name = "FILE")]
        secret_file: Option<PathBuf>,
    },
    /// Delete a credential: requests are no longer given its secret.
    ///
    /// Example:
    ///   sandgate credential delete github
    #[command(verbatim_doc_comment)]
    Delete {
        /// The credential's name.
        name: String,
    },
}

/// What a credential is, from a JSON file and flags (the flags win).
#[derive(Debug, clap::Args)]
pub struct Definition {
    /// The definition as JSON (`destinations`, `apply`, `placeholder_env`,
    /// `scrub_response_body`, `user`; no `secret`), a file or `-`.
    #[arg(long, short, value_name = "FILE")]
    file: Option<PathBuf>,
    /// A destination, `HOST` or `HOST:PORT` (repeatable; `*.suffix` for subdomains). Without a
    /// port only 443 is allowed.
    #[arg(long = "host", value_name = "HOST[:PORT]")]
    hosts: Vec<String>,
    /// Put the secret in this header, `Name: template` with `{secret}` in the template.
    #[arg(long, value_name = "'NAME: TEMPLATE'", conflicts_with = "basic_user")]
    header: Option<String>,
    /// Use HTTP Basic authentication with this username and the secret as the password.
    #[arg(long, value_name = "USERNAME")]
    basic_user: Option<String>,
    /// The environment variable a sandbox receives the placeholder in, e.g. GITHUB_TOKEN.
    #[arg(long, value_name = "VAR")]
    placeholder_env: Option<String>,
}

/// The workspace option of the credential commands.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkspaceArg {
    /// The workspace whose credentials these are.
    #[arg(
        long,
        global = true,
        value_name = "NAME",
        env = "SANDGATE_WORKSPACE",
        default_value = "default"
    )]
    workspace: String,
}

/// One credential (`get`, `create`).
const CREDENTIAL: Shape = Shape {
    header: &["NAME", "APPLY", "DESTINATIONS", "PLACEHOLDER_ENV"],
    wide: &["WORKSPACE", "USER", "SCRUB_BODY"],
    items: single,
    row,
    id: |c| cell(&c["name"]),
};

const CREDENTIALS: Shape = Shape {
    items: |body| list_of(body, "credentials"),
    ..CREDENTIAL
};

/// `sandgate credential ...`.
pub fn credential(
    cmd: CredentialCommand,
    workspace: &WorkspaceArg,
    gateway: &GatewayArgs,
    out: &OutputArgs,
) -> i32 {
    let ws = workspace.workspace.clone();
    run_client(gateway, out, |api| async move {
        let base = format!("{}/v1/workspaces/{}/credentials", api.base, encode(&ws));
        let one = |name: &str| format!("{base}/{}", encode(name));
        let (status, body, shape) = match cmd {
            CredentialCommand::Create {
                name,
                definition,
                secret_file,
            } => {
                let mut body = definition.body()?;
                body["name"] = json!(name);
                body["secret"] = json!(secret(secret_file.as_deref())?);
                let (s, b) = api.send(api.http.post(&base).json(&body), &base).await?;
                (s, b, &CREDENTIAL)
            }
            CredentialCommand::List => {
                let (s, b) = api.send(api.http.get(&base), &base).await?;
                (s, b, &CREDENTIALS)
            }
            CredentialCommand::Get { name } => {
                let (s, b) = api.send(api.http.get(one(&name)), &one(&name)).await?;
                (s, b, &CREDENTIAL)
            }
            CredentialCommand::Rotate { name, secret_file } => {
                let (s, b) = rotate(&api, &one(&name), secret_file.as_deref()).await?;
                (s, b, &CREDENTIAL)
            }
            CredentialCommand::Delete { name } => {
                let (s, b) = api.send(api.http.delete(one(&name)), &one(&name)).await?;
                return Ok(super::files::quiet_reply(out, s, &b));
            }
        };
        Ok(reply(out, status, &body, shape))
    })
}

/// Reads the current definition and puts it back with the new secret.
async fn rotate(api: &Api, url: &str, file: Option<&Path>) -> Result<(u16, Value), CliError> {
    let (status, current) = api.send(api.http.get(url), url).await?;
    if status != 200 {
        return Ok((status, current));
    }
    let mut body = json!({"secret": secret(file)?});
    for field in [
        "user",
        "destinations",
        "apply",
        "placeholder_env",
        "scrub_response_body",
    ] {
        if !current[field].is_null() {
            body[field] = current[field].clone();
        }
    }
    api.send(api.http.put(url).json(&body), url).await
}

impl Definition {
    /// The create body without name and secret.
    fn body(&self) -> Result<Value, CliError> {
        let mut body = match &self.file {
            Some(path) => read_json(path)?,
            None => json!({}),
        };
        if !body.is_object() {
            return Err(CliError::Usage("--file must hold a JSON object".into()));
        }
        if !self.hosts.is_empty() {
            let rules: Result<Vec<Value>, CliError> =
                self.hosts.iter().map(|h| destination(h)).collect();
            body["destinations"] = Value::Array(rules?);
        }
        if let Some(header) = &self.header {
            let Some((name, template)) = header.split_once(':') else {
                return Err(CliError::Usage(format!(
                    "--header {header:?}: expected 'Name: template', e.g. 'Authorization: Bearer {{secret}}'"
                )));
            };
            body["apply"] =
                json!({"type": "header", "name": name.trim(), "template": template.trim()});
        }
        if let Some(username) = &self.basic_user {
            body["apply"] = json!({"type": "basic", "username": username});
        }
        if let Some(var) = &self.placeholder_env {
            body["placeholder_env"] = json!(var);
        }
        Ok(body)
    }
}

/// `HOST` or `HOST:PORT` as a destination rule.
fn destination(spec: &str) -> Result<Value, CliError> {
    match spec.rsplit_once(':') {
        Some((host, port)) => {
            let port: u16 = port.parse().ok().filter(|p| *p > 0).ok_or_else(|| {
                CliError::Usage(format!("--host {spec:?}: the port must be 1 to 65535"))
            })?;
            Ok(json!({"host": host, "ports": [port]}))
        }
        None => Ok(json!({"host": spec})),
    }
}

/// The secret from `file`, or standard input; one final newline (`echo`'s) is dropped.
fn secret(file: Option<&Path>) -> Result<String, CliError> {
    let read_failed = |path: &Path, source| CliError::Read {
        path: path.to_path_buf(),
        source,
    };
    let text = match file {
        Some(path) if path.as_os_str() != "-" => {
            std::fs::read_to_string(path).map_err(|e| read_failed(path, e))?
        }
        _ => {
            if std::io::stdin().is_terminal() {
                eprintln!("reading the secret from standard input (end with Ctrl-D)");
            }
            std::io::read_to_string(std::io::stdin()).map_err(|e| read_failed(Path::new("-"), e))?
        }
    };
    let secret = text
        .strip_suffix('\n')
        .map(|s| s.strip_suffix('\r').unwrap_or(s))
        .unwrap_or(&text);
    if secret.is_empty() {
        return Err(CliError::Usage(
            "the secret is empty: pipe it on standard input or pass --secret-file".into(),
        ));
    }
    Ok(secret.to_string())
}

fn row(c: &Value, wide: bool) -> Vec<String> {
    let mut row = vec![
        cell(&c["name"]),
        apply(&c["apply"]),
        destinations(&c["destinations"]),
        cell(&c["placeholder_env"]),
    ];
    if wide {
        row.extend([
            cell(&c["workspace"]),
            cell(&c["user"]),
            cell(&c["scrub_response_body"]),
        ]);
    }
    row
}

/// `header Authorization`, `basic`, `query key`, `aws_sigv4 s3`, ...
fn apply(a: &Value) -> String {
    let kind = cell(&a["type"]);
    let detail = ["name", "param", "service"]
        .iter()
        .find_map(|k| a[*k].as_str())
        .map(|d| format!(" {}", super::term::clean(d)))
        .unwrap_or_default();
    format!("{kind}{detail}")
}

/// `api.github.com:443,*.example.com:443,8443`: each host with its ports (443 when none
/// are listed, as the API applies).
fn destinations(d: &Value) -> String {
    let rules = d.as_array().map(Vec::as_slice).unwrap_or(&[]);
    if rules.is_empty() {
        return "-".into();
    }
    let parts: Vec<String> = rules
        .iter()
        .map(|r| {
            let ports: Vec<String> = r["ports"]
                .as_array()
                .map(|p| p.iter().map(|n| n.to_string()).collect())
                .filter(|p: &Vec<String>| !p.is_empty())
                .unwrap_or_else(|| vec!["443".into()]);
            format!("{}:{}", cell(&r["host"]), ports.join("+"))
        })
        .collect();
    parts.join(",")
}
