//! `sandgate sandbox files ...`: `read` writes the file's bytes to stdout as they are;
//! `ls` is a table (`-rw-r--r--` modes) or the API's JSON; `write`, `rm` and `mkdir` print
//! nothing on success (as `cp`, `rm` and `mkdir` do).

use std::io::Write as _;
use std::path::Path;

use serde_json::Value;

use super::output::{self, OutputArgs};
use super::sandbox::{reply, FilesCommand};
use super::{encode, shapes, Api, CliError};

pub(super) async fn run(api: &Api, out: &OutputArgs, cmd: FilesCommand) -> Result<i32, CliError> {
    let url = |id: &str, what: &str, path: &str| {
        format!(
            "{}/v1/sandboxes/{}/{what}?path={}",
            api.base,
            encode(id),
            encode(path)
        )
    };
    let (status, body) = match cmd {
        FilesCommand::Read { id, path } => {
            return read(api, out, &url(&id, "files/content", &path)).await
        }
        FilesCommand::Write { id, path, from } => {
            let data = local_bytes(&from)?;
            let url = url(&id, "files/content", &path);
            api.send(api.http.put(&url).body(data), &url).await?
        }
        FilesCommand::Ls { id, path } => {
            let url = url(&id, "files", &path);
            let (status, body) = api.send(api.http.get(&url), &url).await?;
            return Ok(reply(out, status, &body, &shapes::FILES));
        }
        FilesCommand::Rm {
            id,
            path,
            recursive,
        } => {
            let url = format!("{}&recursive={recursive}", url(&id, "files", &path));
            api.send(api.http.delete(&url), &url).await?
        }
        FilesCommand::Mkdir { id, path, parents } => {
            let url = format!("{}&parents={parents}", url(&id, "files/mkdir", &path));
            api.send(api.http.post(&url), &url).await?
        }
    };
    Ok(quiet_reply(out, status, &body))
}

/// A write, rm or mkdir: nothing on success unless `-o json|yaml` asks for the body the API
/// sent (usually none).
pub(super) fn quiet_reply(out: &OutputArgs, status: u16, body: &Value) -> i32 {
    if !(200..300).contains(&status) {
        eprint!("{}", output::api_error(out.output, status, body));
        return output::exit_code(status);
    }
    let explicit = matches!(
        out.output,
        Some(output::Format::Json | output::Format::Yaml)
    );
    if explicit && !out.quiet && *body != Value::String(String::new()) {
        print!(
            "{}",
            output::render(out.format(), false, body, &shapes::DOCUMENT)
        );
    }
    output::OK
}

async fn read(api: &Api, out: &OutputArgs, url: &str) -> Result<i32, CliError> {
    let resp = api
        .http
        .get(url)
        .bearer_auth(&api.token)
        .send()
        .await
        .map_err(|e| api.failed(url, e))?;
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.map_err(|e| api.failed(url, e))?;
    if (200..300).contains(&status) {
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(&bytes);
        let _ = stdout.flush();
        return Ok(output::OK);
    }
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    eprint!("{}", output::api_error(out.output, status, &body));
    Ok(output::exit_code(status))
}

fn local_bytes(from: &Path) -> Result<Vec<u8>, CliError> {
    let failed = |source| CliError::Read {
        path: from.to_path_buf(),
        source,
    };
    if from.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf).map_err(failed)?;
        return Ok(buf);
    }
    std::fs::read(from).map_err(failed)
}
