//! Watching a directory of a sandbox: inotify on the sandbox's tree, from the host.
//!
//! ## Contract
//! * The directory is a sandbox path, resolved like every file operation (`fs`): `..` is
//!   refused and the lookup is `openat2(RESOLVE_IN_ROOT)` from the sandbox root, so a
//!   symlink the sandbox planted (`/home/user/x -> /etc`, `-> ../../..`, an absolute host
//!   path) resolves inside the root and never makes the gateway watch a host directory. The
//!   inotify watch is added on the descriptor that lookup opened (`/proc/self/fd/N`), not on
//!   a path that could be swapped between the check and the watch. Subdirectories of a
//!   recursive watch are opened the same way, their last component with `O_NOFOLLOW`: a
//!   symlink to a directory is reported as an entry, never descended into.
//! * Events: [`FsEventKind`] (E2B's set: create, write, remove, rename, chmod), each with the
//!   entry's path relative to the watched directory (`sub/file.txt`). A move within the tree
//!   is a `rename` of the old name and a `create` of the new one. Names are those the entries
//!   had when their directory was first watched: a watched subdirectory that is later renamed
//!   still reports under its old name (as envd's watcher does).
//! * Recursive: the tree is watched at the start, and each directory created (or moved) into
//!   it later is watched when its `create` arrives; what was written into it before then is
//!   not reported.
//! * Bounded: at most [`WatchLimits::dirs`] directories watched at once per sandbox (all its
//!   watchers together; a start that needs more is refused, a new subdirectory past the limit
//!   is reported as [`WatchEvent::Overflow`]), at most [`WatchLimits::watchers`] watchers per
//!   sandbox, and at most [`WatchLimits::queue`] events waiting for a reader that falls
//!   behind: events past that are dropped, and the reader gets one
//!   [`WatchEvent::Overflow`] before the next event that fits. The kernel's own queue
//!   overflowing is reported the same way.
//! * The watch ends (the receiver yields `None`) when the sandbox is stopped or deleted,
//!   when the watched directory is removed, or when the receiver is dropped.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
use tokio::sync::mpsc;

use super::fs::{components, Confined};
use super::LocalboxError;

/// What happened to an entry of a watched directory (E2B's `EventType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsEventKind {
    Create,
    Write,
    Remove,
    Rename,
    Chmod,
}

impl FsEventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FsEventKind::Create => "create",
            FsEventKind::Write => "write",
            FsEventKind::Remove => "remove",
            FsEventKind::Rename => "rename",
            FsEventKind::Chmod => "chmod",
        }
    }
}

/// One event of a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// `name` is relative to the watched directory.
    Fs { kind: FsEventKind, name: String },
    /// Events were lost here (see the module docs); `reason` says why.
    Overflow { reason: String },
}

/// The bounds of watching (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchLimits {
    /// Directories watched at once per sandbox.
    pub dirs: usize,
    /// Watchers open at once per sandbox.
    pub watchers: usize,
    /// Events waiting for a slow reader, per watcher.
    pub queue: usize,
}

impl Default for WatchLimits {
    fn default() -> Self {
        WatchLimits {
            dirs: 4096,
            watchers: 16,
            queue: 1024,
        }
    }
}

/// A sandbox's share of watching: what its watchers hold now.
#[derive(Debug, Default)]
pub(crate) struct Budget {
    dirs: AtomicUsize,
    watchers: AtomicUsize,
}

impl Budget {
    fn take(counter: &AtomicUsize, limit: usize) -> bool {
        counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok()
    }
}

/// A running watch: its events, until it ends (see the module docs).
#[derive(Debug)]
pub struct Watcher {
    events: mpsc::Receiver<WatchEvent>,
}

impl Watcher {
    /// The next event; `None` once the watch has ended.
    pub async fn next(&mut self) -> Option<WatchEvent> {
        self.events.recv().await
    }

    pub fn into_receiver(self) -> mpsc::Receiver<WatchEvent> {
        self.events
    }
}

/// What a watch is asked for.
pub(crate) struct Request<'a> {
    pub confined: Confined<'a>,
    pub path: &'a str,
    pub recursive: bool,
    pub limits: WatchLimits,
    pub budget: Arc<Budget>,
}

/// Everything inotify reports that maps to an event, plus `IGNORED` (always delivered).
fn mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::MODIFY
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::ATTRIB
        | WatchMask::ONLYDIR
        | WatchMask::EXCL_UNLINK
}

/// The watched directories of one watcher and their paths below the watched one.
struct Tree {
    watches: Watches,
    /// Sandbox path components of the watched directory.
    base: Vec<String>,
    dirs: HashMap<WatchDescriptor, Vec<String>>,
    top: Option<WatchDescriptor>,
    recursive: bool,
    limits: WatchLimits,
    budget: Arc<Budget>,
}

impl Drop for Tree {
    fn drop(&mut self) {
        self.budget
            .dirs
            .fetch_sub(self.dirs.len(), Ordering::AcqRel);
        self.budget.watchers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a directory was not watched.
enum Skip {
    /// The per-sandbox limit is reached.
    Limit,
    /// Gone, not a directory, a symlink, ...: nothing to watch.
    Io(std::io::Error),
}

impl Tree {
    /// Watches the directory at `rel` (below the watched one), opened inside the root.
    fn add(&mut self, confined: &Confined<'_>, rel: Vec<String>) -> Result<OwnedFd, Skip> {
        if !Budget::take(&self.budget.dirs, self.limits.dirs) {
            return Err(Skip::Limit);
        }
        let release = |budget: &Budget| budget.dirs.fetch_sub(1, Ordering::AcqRel);
        let parts: Vec<String> = self.base.iter().chain(&rel).cloned().collect();
        // Below the watched directory a symlink is an entry, never followed.
        let nofollow = if rel.is_empty() { 0 } else { libc::O_NOFOLLOW };
        let fd = match confined.open_in_root(&parts, libc::O_RDONLY | libc::O_DIRECTORY | nofollow)
        {
            Ok(fd) => fd,
            Err(e) => {
                release(&self.budget);
                return Err(Skip::Io(e));
            }
        };
        // The magic link names the very directory just opened inside the root.
        let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        match self.watches.add(&proc_path, mask()) {
            Ok(wd) => {
                if self.dirs.insert(wd.clone(), rel).is_some() {
                    // The same directory again (a watch is per inode): counted once.
                    release(&self.budget);
                }
                if self.top.is_none() {
                    self.top = Some(wd);
                }
                Ok(fd)
            }
            Err(e) => {
                release(&self.budget);
                Err(Skip::Io(e))
            }
        }
    }

    /// Watches `rel` and, when recursive, every directory below it (breadth first). Stops
    /// at the limit: `Err(Skip::Limit)` then, with what was added kept.
    fn add_tree(&mut self, confined: &Confined<'_>, rel: Vec<String>) -> Result<(), Skip> {
        let mut pending = std::collections::VecDeque::from([rel]);
        let mut first = true;
        while let Some(rel) = pending.pop_front() {
            let fd = match self.add(confined, rel.clone()) {
                Ok(fd) => fd,
                Err(Skip::Io(e)) if first => return Err(Skip::Io(e)),
                // A subdirectory that vanished or turned into something else: skipped.
                Err(Skip::Io(_)) => continue,
                Err(Skip::Limit) => return Err(Skip::Limit),
            };
            first = false;
            if !self.recursive {
                break;
            }
            let Ok(entries) = std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd())) else {
                continue;
            };
            for entry in entries.flatten() {
                // DirEntry::file_type does not follow symlinks.
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    let mut sub = rel.clone();
                    sub.push(entry.file_name().to_string_lossy().into_owned());
                    pending.push_back(sub);
                }
            }
        }
        Ok(())
    }
}

/// Starts a watch: the directory (and, when recursive, its tree) is watched before this
/// returns, so everything that happens afterwards is reported.
pub(crate) fn start(
    request: Request<'_>,
    stopped: tokio::sync::watch::Receiver<u64>,
) -> Result<Watcher, LocalboxError> {
    let Request {
        confined,
        path,
        recursive,
        limits,
        budget,
    } = request;
    let base = components(path)?;
    if !Budget::take(&budget.watchers, limits.watchers) {
        return Err(LocalboxError::Invalid(format!(
            "{} watches are open on this sandbox already (the limit)",
            limits.watchers
        )));
    }
    let inotify = match Inotify::init() {
        Ok(inotify) => inotify,
        Err(e) => {
            budget.watchers.fetch_sub(1, Ordering::AcqRel);
            return Err(LocalboxError::setup("starting a watch (inotify)", e));
        }
    };
    let mut tree = Tree {
        watches: inotify.watches(),
        base,
        dirs: HashMap::new(),
        top: None,
        recursive,
        limits,
        budget,
    };
    match tree.add_tree(&confined, Vec::new()) {
        Ok(()) => {}
        Err(Skip::Io(e)) => return Err(file_error(path, e)),
        Err(Skip::Limit) => {
            return Err(LocalboxError::Invalid(format!(
                "watching {path:?} needs more than {} directories (the limit of a sandbox's \
                 watches): watch a smaller tree, or without recursive",
                limits.dirs
            )))
        }
    }
    let stream = inotify
        .into_event_stream(vec![0u8; 16 * 1024])
        .map_err(|e| LocalboxError::setup("starting a watch (inotify)", e))?;
    let (tx, rx) = mpsc::channel(limits.queue.max(1));
    let root = confined.root.to_path_buf();
    let (uid, gid) = (confined.uid, confined.gid);
    tokio::spawn(async move {
        let confined = Confined {
            root: &root,
            uid,
            gid,
        };
        pump(tree, stream, confined, Queue::new(tx), stopped).await;
    });
    Ok(Watcher { events: rx })
}

fn file_error(path: &str, source: std::io::Error) -> LocalboxError {
    LocalboxError::File {
        path: path.to_string(),
        source,
    }
}

/// The bounded queue to the reader, with the overflow marker owed after a drop.
struct Queue {
    tx: mpsc::Sender<WatchEvent>,
    lost: Option<String>,
}

impl Queue {
    fn new(tx: mpsc::Sender<WatchEvent>) -> Queue {
        Queue { tx, lost: None }
    }

    /// Queues `event` without waiting; `false` once the reader is gone.
    fn push(&mut self, event: WatchEvent) -> bool {
        use mpsc::error::TrySendError;
        if let Some(reason) = self.lost.take() {
            match self.tx.try_send(WatchEvent::Overflow { reason }) {
                Ok(()) => {}
                Err(TrySendError::Full(WatchEvent::Overflow { reason })) => {
                    self.lost = Some(reason);
                    return true;
                }
                Err(TrySendError::Full(_)) => return true,
                Err(TrySendError::Closed(_)) => return false,
            }
        }
        match self.tx.try_send(event) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                self.lost = Some("events were dropped: the reader fell behind".into());
                true
            }
            Err(TrySendError::Closed(_)) => false,
        }
    }

    /// Reports a loss the kernel or the limit caused (ahead of the next event).
    fn lose(&mut self, reason: &str) -> bool {
        self.push(WatchEvent::Overflow {
            reason: reason.to_string(),
        })
    }
}

async fn pump(
    mut tree: Tree,
    mut stream: inotify::EventStream<Vec<u8>>,
    confined: Confined<'_>,
    mut queue: Queue,
    mut stopped: tokio::sync::watch::Receiver<u64>,
) {
    loop {
        let event = tokio::select! {
            // The sandbox was stopped or deleted (or its runtime dropped).
            _ = stopped.changed() => return,
            _ = queue.tx.closed() => return,
            event = stream.next() => event,
        };
        let Some(Ok(event)) = event else {
            return;
        };
        if !handle(&mut tree, &confined, &mut queue, event) {
            return;
        }
    }
}

/// Turns one inotify event into watch events; `false` when the watch is over.
fn handle(
    tree: &mut Tree,
    confined: &Confined<'_>,
    queue: &mut Queue,
    event: inotify::Event<std::ffi::OsString>,
) -> bool {
    if event.mask.contains(EventMask::Q_OVERFLOW) {
        return queue.lose("the kernel's event queue overflowed");
    }
    if event.mask.contains(EventMask::IGNORED) {
        // The directory is gone (or its file system was unmounted).
        if tree.dirs.remove(&event.wd).is_some() {
            tree.budget.dirs.fetch_sub(1, Ordering::AcqRel);
        }
        return tree.top.as_ref() != Some(&event.wd);
    }
    let (Some(dir), Some(name)) = (tree.dirs.get(&event.wd), event.name.as_ref()) else {
        return true;
    };
    let name = name.to_string_lossy().into_owned();
    let mut rel = dir.clone();
    rel.push(name);
    let joined = rel.join("/");
    let kinds = [
        (EventMask::CREATE | EventMask::MOVED_TO, FsEventKind::Create),
        (EventMask::MODIFY, FsEventKind::Write),
        (EventMask::DELETE, FsEventKind::Remove),
        (EventMask::MOVED_FROM, FsEventKind::Rename),
        (EventMask::ATTRIB, FsEventKind::Chmod),
    ];
    for (bits, kind) in kinds {
        if event.mask.intersects(bits) {
            let fs = WatchEvent::Fs {
                kind,
                name: joined.clone(),
            };
            if !queue.push(fs) {
                return false;
            }
        }
    }
    let new_dir = event.mask.contains(EventMask::ISDIR)
        && event
            .mask
            .intersects(EventMask::CREATE | EventMask::MOVED_TO);
    if tree.recursive && new_dir {
        // A walk of system calls on this task: bounded by the sandbox's directory limit
        // (a thousand directories take about 50 ms), and the directory must be watched
        // before what follows in it is missed.
        if let Err(Skip::Limit) = tree.add_tree(confined, rel) {
            return queue.lose(&format!(
                "{joined} is not watched: the sandbox watches {} directories already (the limit)",
                tree.limits.dirs
            ));
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_events_and_owes_one_overflow() {
        let (tx, mut rx) = mpsc::channel(2);
        let mut queue = Queue::new(tx);
        let ev = |n: &str| WatchEvent::Fs {
            kind: FsEventKind::Create,
            name: n.to_string(),
        };
        for name in ["a", "b", "c", "d"] {
            assert!(queue.push(ev(name)));
        }
        assert_eq!(rx.try_recv().unwrap(), ev("a"));
        assert_eq!(rx.try_recv().unwrap(), ev("b"));
        assert!(rx.try_recv().is_err(), "c and d were dropped");
        assert!(queue.push(ev("e")));
        assert!(matches!(
            rx.try_recv().unwrap(),
            WatchEvent::Overflow { .. }
        ));
        assert_eq!(rx.try_recv().unwrap(), ev("e"));
        drop(rx);
        assert!(!queue.push(ev("f")), "the reader is gone");
    }

    #[test]
    fn the_budget_stops_at_its_limit() {
        let counter = AtomicUsize::new(0);
        assert!(Budget::take(&counter, 2));
        assert!(Budget::take(&counter, 2));
        assert!(!Budget::take(&counter, 2));
        assert_eq!(counter.load(Ordering::Relaxed), 2);
    }
}
