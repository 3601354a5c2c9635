//! Starting a command inside a running sandbox: born in its PID namespace, it joins the
//! other namespaces, chroots, drops to the sandbox user and installs the seccomp filter
//! between `fork` and `execve`.
//!
//! This is what `nsenter` did, done here because the filter must come last, after the
//! calls it refuses (`setns`, `chroot`) were made.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use tokio::process::{Child, Command};

use super::seccomp::Filter;

/// What a child needs to enter a sandbox, opened before the fork (the child only makes
/// system calls on it). Every file is close-on-exec.
pub(crate) struct Entry {
    /// IPC, UTS, network, then mount: the mount namespace last, as the paths of the others
    /// are host paths.
    namespaces: Vec<(File, libc::c_int)>,
    root: File,
    cwd: CString,
    /// Written to stderr when `cwd` cannot be entered (then the child exits with 1).
    cwd_error: Vec<u8>,
    uid: libc::uid_t,
    gid: libc::gid_t,
    filter: Option<Arc<Filter>>,
}

impl Entry {
    /// Opens the namespaces and root of the sandbox whose PID 1 is `pid1`; returns the
    /// entry and the PID namespace (for [`spawn_in_pid_ns`]).
    pub fn open(
        pid1: u32,
        cwd: &str,
        uid: u32,
        gid: u32,
        filter: Option<Arc<Filter>>,
    ) -> std::io::Result<(Entry, File)> {
        let ns = |name: &str| File::open(format!("/proc/{pid1}/ns/{name}"));
        let namespaces = vec![
            (ns("ipc")?, libc::CLONE_NEWIPC),
            (ns("uts")?, libc::CLONE_NEWUTS),
            (ns("net")?, libc::CLONE_NEWNET),
            (ns("mnt")?, libc::CLONE_NEWNS),
        ];
        let root = File::open(format!("/proc/{pid1}/root"))?;
        let cwd_c = CString::new(cwd).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "cwd contains a NUL byte")
        })?;
        let entry = Entry {
            namespaces,
            root,
            cwd: cwd_c,
            cwd_error: format!("sandgate: cannot change directory to {cwd}\n").into_bytes(),
            uid,
            gid,
            filter,
        };
        Ok((entry, ns("pid")?))
    }

    /// In the child: namespaces, root, working directory, user, filter.
    fn enter(&self) -> std::io::Result<()> {
        let check = |rc: libc::c_int| {
            if rc == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        };
        // SAFETY: plain system calls on descriptors and strings that live as long as
        // `self`; nothing allocates (the child of a multithreaded process may not).
        unsafe {
            for (file, nstype) in &self.namespaces {
                check(libc::setns(file.as_raw_fd(), *nstype))?;
            }
            check(libc::fchdir(self.root.as_raw_fd()))?;
            check(libc::chroot(c".".as_ptr()))?;
            if libc::chdir(self.cwd.as_ptr()) != 0 {
                libc::write(2, self.cwd_error.as_ptr().cast(), self.cwd_error.len());
                libc::_exit(1);
            }
            check(libc::setgroups(0, std::ptr::null()))?;
            check(libc::setgid(self.gid))?;
            check(libc::setuid(self.uid))?;
        }
        match &self.filter {
            Some(filter) => filter.install(),
            None => Ok(()),
        }
    }

    /// Makes `cmd` enter the sandbox after its earlier pre-exec hooks (joining cgroups by
    /// their host paths) ran.
    pub fn before_exec(self, cmd: &mut Command) {
        // SAFETY: `enter` only makes async-signal-safe system calls (see there).
        unsafe {
            cmd.pre_exec(move || self.enter());
        }
    }
}

/// Spawns `cmd` from a thread of its own that entered the PID namespace `pidns` first, so
/// the child is born inside it (a process cannot change its own PID namespace). The thread
/// ends right after, so no pooled thread ever forks into a sandbox.
pub(crate) async fn spawn_in_pid_ns(pidns: File, mut cmd: Command) -> std::io::Result<Child> {
    let handle = tokio::runtime::Handle::current();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("localbox-exec".into())
        .spawn(move || {
            // SAFETY: setns on a valid namespace descriptor; for CLONE_NEWPID it only
            // decides where this thread's children are born.
            let result = if unsafe { libc::setns(pidns.as_raw_fd(), libc::CLONE_NEWPID) } != 0 {
                Err(std::io::Error::last_os_error())
            } else {
                let _runtime = handle.enter();
                cmd.spawn()
            };
            let _ = tx.send(result);
        })?;
    rx.await
        .map_err(|_| std::io::Error::other("the exec thread ended without an answer"))?
}
