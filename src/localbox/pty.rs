//! Interactive commands: a pseudo-terminal, or a pipe on standard input, fed while the
//! command runs.
//!
//! A terminal command gets a fresh pseudo-terminal from the host's `/dev/ptmx`: its slave
//! becomes the command's standard input, output and error and its controlling terminal (the
//! command leads a session of its own), so job control, line editing and Ctrl-C work as in a
//! terminal. Its output (stdout and stderr merged, as a terminal merges them) arrives as
//! `Stdout` events; input, window sizes and signals go through [`ExecInput`].
//!
//! The master side never enters the sandbox: the gateway reads and writes it; nothing the
//! command does can reach beyond its own terminal (a `TIOCSTI` pushes bytes into its own
//! input only).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::process::{ChildStdin, Command};
use tokio::sync::mpsc;

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WinSize {
    pub rows: u16,
    pub cols: u16,
}

impl WinSize {
    /// The size a terminal gets when none is asked for.
    pub const DEFAULT: WinSize = WinSize { rows: 24, cols: 80 };
}

/// What a caller sends a running interactive command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecInput {
    /// Bytes for its standard input (for a terminal: as if typed, so `\x03` is Ctrl-C).
    Data(Bytes),
    /// End of input: closes a pipe; on a terminal sends the EOF character (Ctrl-D).
    Eof,
    /// The terminal's new size (the command gets `SIGWINCH`); ignored without a terminal.
    Resize(WinSize),
    /// A signal for the terminal's foreground process group, or without a terminal the
    /// command's process group. Only [`ALLOWED_SIGNALS`] are sent.
    Signal(i32),
}

/// Signals a caller may send: those a terminal user can cause, plus the ones that end or
/// resume a command.
pub const ALLOWED_SIGNALS: &[i32] = &[
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGKILL,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGTERM,
    libc::SIGCONT,
    libc::SIGSTOP,
    libc::SIGTSTP,
    libc::SIGWINCH,
];

/// The signal number of a name such as `INT` or `SIGINT` (case-insensitive).
pub fn signal_number(name: &str) -> Option<i32> {
    let upper = name.trim().to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    Some(match bare {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "TERM" => libc::SIGTERM,
        "CONT" => libc::SIGCONT,
        "STOP" => libc::SIGSTOP,
        "TSTP" => libc::SIGTSTP,
        "WINCH" => libc::SIGWINCH,
        _ => return None,
    })
}

/// How a command's standard streams are wired.
pub(crate) enum Io {
    /// stdin from `/dev/null`, stdout and stderr piped (plain exec).
    Pipes,
    /// stdin piped too, fed from [`ExecInput`].
    Stdin,
    /// A pseudo-terminal: the master stays here, the slave goes to the command.
    Terminal { master: OwnedFd, slave: File },
}

impl Io {
    /// Opens what `tty`/`stdin` ask for; the slave is owned by the sandbox user so the
    /// command can reopen its terminal (`/dev/tty`) and change its modes.
    pub fn open(tty: Option<WinSize>, stdin: bool, uid: u32, gid: u32) -> std::io::Result<Io> {
        match tty {
            Some(size) => {
                let (master, slave) = open_pty(size)?;
                // SAFETY: fchown on a descriptor we own.
                unsafe { libc::fchown(slave.as_raw_fd(), uid, gid) };
                Ok(Io::Terminal { master, slave })
            }
            None if stdin => Ok(Io::Stdin),
            None => Ok(Io::Pipes),
        }
    }

    /// Wires `cmd`'s standard streams and, for a terminal, a hook (to run before any other
    /// pre-exec hook, so before the seccomp filter) that starts a session and takes the
    /// terminal as the controlling one. Otherwise the command leads a process group, so
    /// that its tree can be killed as one. Returns the master, if any.
    pub fn configure(self, cmd: &mut Command) -> std::io::Result<Option<OwnedFd>> {
        match self {
            Io::Pipes | Io::Stdin => {
                let stdin = if matches!(self, Io::Stdin) {
                    Stdio::piped()
                } else {
                    Stdio::null()
                };
                cmd.stdin(stdin)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .process_group(0);
                Ok(None)
            }
            Io::Terminal { master, slave } => {
                cmd.stdin(slave.try_clone()?)
                    .stdout(slave.try_clone()?)
                    .stderr(slave);
                // SAFETY: setsid and ioctl are async-signal-safe; fd 0 is the slave by now
                // (stdio is set up before pre-exec hooks run).
                unsafe {
                    cmd.pre_exec(|| {
                        if libc::setsid() < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
                Ok(Some(master))
            }
        }
    }
}

/// A new pseudo-terminal pair of the given size; both ends close-on-exec (the command gets
/// the slave as its stdio, duplicated without the flag).
fn open_pty(size: WinSize) -> std::io::Result<(OwnedFd, File)> {
    let last = std::io::Error::last_os_error;
    // SAFETY: posix_openpt/grantpt/unlockpt/ptsname_r on the descriptor just opened; the
    // name buffer outlives the calls; every descriptor is owned once it exists.
    unsafe {
        let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(last());
        }
        let master = OwnedFd::from_raw_fd(fd);
        if libc::grantpt(fd) != 0 || libc::unlockpt(fd) != 0 {
            return Err(last());
        }
        let mut name = [0 as libc::c_char; 128];
        let rc = libc::ptsname_r(fd, name.as_mut_ptr(), name.len());
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        let sfd = libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if sfd < 0 {
            return Err(last());
        }
        let slave = File::from_raw_fd(sfd);
        set_size(master.as_raw_fd(), size)?;
        Ok((master, slave))
    }
}

fn set_size(fd: libc::c_int, size: WinSize) -> std::io::Result<()> {
    let ws = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize that lives across the call.
    if unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &ws) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The master side of a terminal, non-blocking, shared by the output reader and the input
/// writer.
#[derive(Clone)]
pub(crate) struct Master(Arc<AsyncFd<File>>);

impl Master {
    pub fn new(fd: OwnedFd) -> std::io::Result<Master> {
        // SAFETY: fcntl on a descriptor we own.
        unsafe {
            let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        // SAFETY: the `File` owns the descriptor and keeps it open for the `AsyncFd`'s
        // whole life; nothing else closes or replaces it.
        let registered = unsafe { AsyncFd::register(File::from(fd)) };
        let fd = registered.map_err(|e| e.into_parts().1)?;
        Ok(Master(Arc::new(fd)))
    }

    fn fd(&self) -> libc::c_int {
        self.0.get_ref().as_raw_fd()
    }
}

impl AsyncRead for Master {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| fd.get_ref().read(unfilled)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // EIO: every slave descriptor is closed, the terminal's end of file.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Poll::Ready(Ok(())),
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Master {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        loop {
            let mut guard = ready!(self.0.poll_write_ready(cx))?;
            match guard.try_io(|fd| fd.get_ref().write(buf)) {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Where a running command's input goes.
pub(crate) enum Sink {
    /// `None` once the caller ended the input.
    Pipe(Option<ChildStdin>),
    Terminal(Master),
}

/// Feeds a command's input until the caller drops its sender or the command's input
/// closes. `pgid` is the command's process group (its session, with a terminal).
pub(crate) async fn feed(mut sink: Sink, pgid: u32, mut input: mpsc::Receiver<ExecInput>) {
    while let Some(item) = input.recv().await {
        let written = match (&mut sink, item) {
            (Sink::Pipe(Some(pipe)), ExecInput::Data(bytes)) => pipe.write_all(&bytes).await,
            (Sink::Pipe(None), ExecInput::Data(_)) => Ok(()),
            (Sink::Terminal(master), ExecInput::Data(bytes)) => master.write_all(&bytes).await,
            (Sink::Pipe(pipe), ExecInput::Eof) => {
                *pipe = None;
                Ok(())
            }
            (Sink::Terminal(master), ExecInput::Eof) => {
                let eof = eof_char(master.fd());
                master.write_all(&[eof]).await
            }
            (Sink::Terminal(master), ExecInput::Resize(size)) => set_size(master.fd(), size),
            (Sink::Pipe(_), ExecInput::Resize(_)) => Ok(()),
            (sink, ExecInput::Signal(sig)) => {
                if ALLOWED_SIGNALS.contains(&sig) {
                    signal(sink, pgid, sig);
                }
                Ok(())
            }
        };
        if written.is_err() {
            // The command closed its input: later data has nowhere to go, signals still do.
            if let Sink::Pipe(pipe) = &mut sink {
                *pipe = None;
            }
        }
    }
}

/// The terminal's end-of-file character (Ctrl-D unless the command changed it).
fn eof_char(fd: libc::c_int) -> u8 {
    // SAFETY: tcgetattr fills a termios that lives across the call.
    unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        if libc::tcgetattr(fd, &mut t) == 0 {
            return t.c_cc[libc::VEOF];
        }
    }
    4
}

/// Sends `sig` to the terminal's foreground process group (as the terminal itself would),
/// else to the command's group. The foreground group can only be one of the session's, so
/// this never reaches a process outside the command's session.
fn signal(sink: &Sink, pgid: u32, sig: i32) {
    let foreground = match sink {
        // SAFETY: tcgetpgrp on a descriptor we own.
        Sink::Terminal(master) => unsafe { libc::tcgetpgrp(master.fd()) },
        Sink::Pipe(_) => -1,
    };
    let group = if foreground > 1 {
        foreground
    } else {
        match libc::pid_t::try_from(pgid) {
            Ok(p) if p > 1 => p,
            _ => return,
        }
    };
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(-group, sig);
    }
}

/// Kills (SIGKILL) every process of session `sid` (host pids, as `/proc` shows them here):
/// the jobs an interactive shell started in process groups of their own. A process that
/// leaves with `setsid` of its own is not found this way; the exec's cgroup, where there is
/// one, catches it.
pub(crate) fn kill_session(sid: u32) {
    let Ok(sid) = libc::pid_t::try_from(sid) else {
        return;
    };
    if sid <= 1 {
        return;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        if session_of(pid) == Some(sid) {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// The session of `pid` from `/proc/<pid>/stat` (fields after the command name, which may
/// hold anything but ends at the last `)`: state, ppid, pgrp, session).
fn session_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_session() {
        let me = std::process::id() as libc::pid_t;
        // SAFETY: getsid has no preconditions.
        assert_eq!(session_of(me), Some(unsafe { libc::getsid(0) }));
        assert_eq!(session_of(-1), None);
    }

    #[test]
    fn signal_names() {
        assert_eq!(signal_number("int"), Some(libc::SIGINT));
        assert_eq!(signal_number("SIGTERM"), Some(libc::SIGTERM));
        assert_eq!(signal_number("SIGSEGV"), None);
        assert_eq!(signal_number(""), None);
    }

    #[tokio::test]
    async fn a_terminal_echoes_and_reports_its_size() {
        let (master, slave) = open_pty(WinSize {
            rows: 33,
            cols: 101,
        })
        .unwrap();
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        assert_eq!(
            unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) },
            0
        );
        assert_eq!((ws.ws_row, ws.ws_col), (33, 101));
        let mut master = Master::new(master).unwrap();
        master.write_all(b"hi\n").await.unwrap();
        let mut buf = [0u8; 64];
        let n = tokio::io::AsyncReadExt::read(&mut master, &mut buf)
            .await
            .unwrap();
        // The line discipline echoes what was typed.
        assert!(buf[..n].starts_with(b"hi"), "{:?}", &buf[..n]);
        drop(slave);
    }
}
