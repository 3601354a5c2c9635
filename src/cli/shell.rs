//! `sandgate sandbox shell`: a terminal session in a sandbox over the API's WebSocket
//! (`/v1/sandboxes/{id}/pty`, see `api::pty` for the frames).
//!
//! When standard input is a terminal it is put in raw mode for the session (every key,
//! Ctrl-C included, goes to the sandbox's terminal, which echoes and signals as a local one
//! would) and restored when the session ends, however it ends; `SIGWINCH` sends the new
//! size. The exit code is the command's (128+N when killed by signal N, 125 when the API
//! refused or failed).

use std::io::Write;
use std::os::fd::AsRawFd;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::{self, Message};

use super::output::{self, OutputArgs};
use super::{encode, Api, CliError};

/// Exit status when the API refused or failed the session (as `sandbox exec`).
const API_FAILURE: i32 = 125;

/// What `sandgate sandbox shell` asks for, from its flags.
pub(super) struct SessionOptions {
    pub cwd: Option<String>,
    /// `KEY=VALUE` pairs.
    pub env: Vec<String>,
    pub user: Option<String>,
    pub argv: Vec<String>,
}

pub(super) async fn shell(
    api: &Api,
    out: &OutputArgs,
    id: &str,
    options: SessionOptions,
) -> Result<i32, CliError> {
    let stdin = std::io::stdin();
    let size = window_size(stdin.as_raw_fd());
    let url = session_url(&api.base, id, &options, size)?;
    let mut request = url
        .as_str()
        .into_client_request()
        .map_err(|e| CliError::Usage(format!("{}: {e}", api.base)))?;
    let bearer = HeaderValue::from_str(&format!("Bearer {}", api.token))
        .map_err(|_| CliError::Usage("the API token is not a valid header value".into()))?;
    request.headers_mut().insert("authorization", bearer);
    let ws = match super::ws::connect(request).await {
        Ok((ws, _)) => ws,
        Err(tungstenite::Error::Http(response)) => {
            let status = response.status().as_u16();
            let text = String::from_utf8_lossy(response.body().as_deref().unwrap_or_default())
                .into_owned();
            let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
            eprint!("{}", output::api_error(out.output, status, &body));
            return Ok(API_FAILURE);
        }
        Err(tungstenite::Error::Io(e)) => {
            return Err(CliError::Unreachable {
                base: api.base.clone(),
                message: e.to_string(),
            })
        }
        Err(e) => {
            return Err(CliError::Http {
                url: url.split('?').next().unwrap_or_default().to_string(),
                message: e.to_string(),
            })
        }
    };
    let raw = RawMode::enter(stdin.as_raw_fd());
    let code = relay(ws, raw.is_some()).await;
    drop(raw);
    Ok(code)
}

/// The session's WebSocket address: the API's, `ws` for `http`.
fn session_url(
    base: &str,
    id: &str,
    options: &SessionOptions,
    size: Option<(u16, u16)>,
) -> Result<String, CliError> {
    let SessionOptions {
        cwd,
        env,
        user,
        argv,
    } = options;
    let ws_base = if let Some(rest) = base.strip_prefix("http://") {
        format!("ws://{rest}")
    } else if let Some(rest) = base.strip_prefix("https://") {
        format!("wss://{rest}")
    } else {
        return Err(CliError::Usage(format!(
            "the gateway URL {base:?} is neither http:// nor https://"
        )));
    };
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    for arg in argv {
        query.append_pair("argv", arg);
    }
    for pair in env {
        if !pair.contains('=') {
            return Err(CliError::Usage(format!(
                "--env {pair:?}: expected KEY=VALUE"
            )));
        }
        query.append_pair("env", pair);
    }
    if !env.iter().any(|p| p.starts_with("TERM=")) {
        if let Some(term) = std::env::var("TERM").ok().filter(|t| !t.is_empty()) {
            query.append_pair("env", &format!("TERM={term}"));
        }
    }
    if let Some(cwd) = cwd {
        query.append_pair("cwd", cwd);
    }
    if let Some(user) = user {
        query.append_pair("user", user);
    }
    if let Some((rows, cols)) = size {
        query.append_pair("rows", &rows.to_string());
        query.append_pair("cols", &cols.to_string());
    }
    Ok(format!(
        "{}/v1/sandboxes/{}/pty?{}",
        ws_base.trim_end_matches('/'),
        encode(id),
        query.finish()
    ))
}

/// Relays until the session ends; the exit code.
async fn relay<S>(ws: tokio_tungstenite::WebSocketStream<S>, terminal: bool) -> i32
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut sink, mut source) = ws.split();
    let mut input = read_stdin();
    let mut winch =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok();
    let mut code = API_FAILURE;
    let mut input_open = true;
    let mut stdout = std::io::stdout();
    loop {
        tokio::select! {
            message = source.next() => match message {
                Some(Ok(Message::Binary(bytes))) => {
                    let _ = stdout.write_all(&bytes);
                    let _ = stdout.flush();
                }
                Some(Ok(Message::Text(text))) => {
                    let Ok(frame) = serde_json::from_str::<Value>(text.as_str()) else {
                        continue;
                    };
                    match frame["type"].as_str() {
                        Some("exit") => code = exit_code(&frame),
                        Some("error") => {
                            let message = frame["message"].as_str().unwrap_or_default();
                            eprint!("sandgate: {message}\r\n");
                        }
                        _ => {}
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
            chunk = input.recv(), if input_open => {
                let sent = match chunk {
                    Some(bytes) => sink.send(Message::Binary(bytes.into())).await,
                    // Input ended (not a terminal): the remote end gets its end-of-file.
                    None => {
                        input_open = false;
                        sink.send(text(json!({"type": "eof"}))).await
                    }
                };
                if sent.is_err() {
                    break;
                }
            }
            Some(()) = recv_winch(&mut winch), if terminal => {
                if let Some((rows, cols)) = window_size(std::io::stdin().as_raw_fd()) {
                    let resize = json!({"type": "resize", "rows": rows, "cols": cols});
                    if sink.send(text(resize)).await.is_err() {
                        break;
                    }
                }
            }
        }
    }
    code
}

fn text(value: Value) -> Message {
    Message::Text(value.to_string().into())
}

async fn recv_winch(winch: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match winch {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}

/// The exit code of an `exit` frame: the command's, 128+N for signal N.
fn exit_code(frame: &Value) -> i32 {
    if let Some(code) = frame["code"].as_i64() {
        return i32::try_from(code).unwrap_or(API_FAILURE);
    }
    match frame["signal"].as_i64() {
        Some(signal) => 128 + i32::try_from(signal).unwrap_or(0),
        None => API_FAILURE,
    }
}

/// Standard input, read on a thread of its own (a blocking read cannot be cancelled; the
/// thread ends with the process).
fn read_stdin() -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel(16);
    let spawned = std::thread::Builder::new()
        .name("shell-stdin".into())
        .spawn(move || {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match std::io::Read::read(&mut std::io::stdin().lock(), &mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if tx.blocking_send(buf[..n].to_vec()).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    if spawned.is_err() {
        // No input then; the session still shows output.
        return mpsc::channel(1).1;
    }
    rx
}

/// (rows, columns) of the terminal on `fd`, if it is one.
fn window_size(fd: libc::c_int) -> Option<(u16, u16)> {
    // SAFETY: TIOCGWINSZ fills a winsize that lives across the call.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_row > 0 && ws.ws_col > 0).then_some((ws.ws_row, ws.ws_col))
}

/// The terminal in raw mode until dropped (then its settings are put back).
struct RawMode {
    fd: libc::c_int,
    saved: libc::termios,
}

impl RawMode {
    /// `None` when `fd` is not a terminal (input is then relayed as it comes).
    fn enter(fd: libc::c_int) -> Option<RawMode> {
        // SAFETY: tcgetattr/tcsetattr on a descriptor of this process with termios values
        // that live across the calls.
        unsafe {
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::isatty(fd) != 1 || libc::tcgetattr(fd, &mut saved) != 0 {
                return None;
            }
            let mut raw = saved;
            libc::cfmakeraw(&mut raw);
            if libc::tcsetattr(fd, libc::TCSANOW, &raw) != 0 {
                return None;
            }
            Some(RawMode { fd, saved })
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: as in `enter`.
        unsafe {
            libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_urls() {
        let options = |env: Vec<String>| SessionOptions {
            cwd: None,
            env,
            user: None,
            argv: Vec::new(),
        };
        let full = SessionOptions {
            cwd: Some("/tmp".into()),
            env: vec!["A=b c".into(), "TERM=dumb".into()],
            user: Some("root".into()),
            argv: vec!["python3".into(), "-q".into()],
        };
        let url = session_url("http://127.0.0.1:7070/", "sb-1", &full, Some((30, 100))).unwrap();
        assert_eq!(
            url,
            "ws://127.0.0.1:7070/v1/sandboxes/sb-1/pty?argv=python3&argv=-q&env=A%3Db+c\
             &env=TERM%3Ddumb&cwd=%2Ftmp&user=root&rows=30&cols=100"
        );
        assert!(session_url("https://gw", "sb-1", &options(vec![]), None)
            .unwrap()
            .starts_with("wss://gw/v1/sandboxes/sb-1/pty?"));
        assert!(session_url("ftp://gw", "sb-1", &options(vec![]), None).is_err());
        assert!(session_url("http://gw", "sb-1", &options(vec!["X".into()]), None).is_err());
    }

    #[test]
    fn exit_codes() {
        assert_eq!(exit_code(&json!({"code": 3})), 3);
        assert_eq!(exit_code(&json!({"code": null, "signal": 9})), 137);
        assert_eq!(exit_code(&json!({})), API_FAILURE);
    }
}
