//! The proxy's worker threads.
//!
//! Contract:
//! - `[proxy] workers` threads (0: one per core available to the process), each running its
//!   own single-threaded tokio runtime and accepting from the same listening socket (a
//!   duplicate of its descriptor, registered with each thread's own poller; whichever idle
//!   worker wakes first takes the connection).
//! - Everything a connection leads to runs on the thread that accepted it: its CONNECT, the
//!   intercepted tunnel, every request in it, and the upstream connections those requests
//!   use, which come from that worker's own pools (`EgressState::for_worker`).
//! - Shared by all workers: identities, policy, credentials, the leaf cache, the decision log
//!   and the `max_connections` limit.
//! - The API, the creation coordinator, policy reload and the local sandboxes' in-namespace
//!   listeners stay on the main runtime.
//! - Stopping (`Workers::stop`, or dropping them) stops accepting on every worker, then each
//!   worker's runtime is shut down, which closes its connections.
//! - Memory: when the binary sets a release hook ([`set_memory_release`]), each worker calls
//!   it on its own thread every [`RELEASE_EVERY`]. Why on the worker: an allocator with
//!   thread-local heaps (mimalloc) collects a heap only from the thread that owns it, and a
//!   worker's heap is where its tunnels allocated; once they close and the worker is idle,
//!   nothing else would ask it to give pages back.
//!
//! Why not the work-stealing runtime the rest of sandgate uses: there, a proxied request
//! moves between threads at each handoff (client connection task → upstream connection task
//! → back), and each move to a parked thread is a futex wake-up and a cold cache. Measured
//! with `cargo bench --bench egress` on 2 cores: 26 µs of proxy CPU per keep-alive request
//! with two work-stealing workers against 19 µs with the work on one thread, and +230 µs
//! median latency at moderate load where an opaque tunnel adds +40 µs.

use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use super::state::EgressState;

/// How often a worker runs the memory release hook.
pub const RELEASE_EVERY: Duration = Duration::from_secs(1);

static MEMORY_RELEASE: OnceLock<fn()> = OnceLock::new();

/// Sets what a worker calls, on its own thread, to hand its free memory back to the OS
/// (the binary's allocator; the library does not choose one). Set once, before the workers
/// start; later calls are ignored.
pub fn set_memory_release(release: fn()) {
    let _ = MEMORY_RELEASE.set(release);
}

/// Runs the release hook every [`RELEASE_EVERY`] on this worker, when one is set.
async fn release_memory() {
    let Some(release) = MEMORY_RELEASE.get().copied() else {
        return std::future::pending().await;
    };
    let mut tick = tokio::time::interval(RELEASE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        release();
    }
}

/// How many workers `configured` means on this machine.
pub fn count(configured: usize) -> usize {
    if configured > 0 {
        configured
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

/// Running proxy workers; stopped when dropped.
pub struct Workers {
    stop: watch::Sender<bool>,
    threads: Vec<JoinHandle<()>>,
}

/// Starts `workers` threads serving `listener` with (a worker copy of) `state`.
pub fn start(
    listener: std::net::TcpListener,
    state: &EgressState,
    workers: usize,
) -> std::io::Result<Workers> {
    listener.set_nonblocking(true)?;
    let (stop, _) = watch::channel(false);
    let mut running = Workers {
        stop,
        threads: Vec::new(),
    };
    for index in 0..workers.max(1) {
        let listener = listener.try_clone()?;
        let state = Arc::new(state.for_worker());
        let mut stopped = running.stop.subscribe();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // The worker records where the gateway that starts it records (its metrics scope).
        let scope = crate::telemetry::MetricsScope::current();
        let thread = std::thread::Builder::new()
            .name(format!("proxy-worker-{index}"))
            .spawn(move || {
                if let Some(scope) = scope {
                    scope.enter();
                }
                runtime.block_on(async move {
                    let listener = match TcpListener::from_std(listener) {
                        Ok(listener) => listener,
                        Err(e) => {
                            tracing::error!(worker = index, error = %e, "proxy worker cannot poll the listener");
                            return;
                        }
                    };
                    tokio::select! {
                        () = super::accept::serve(listener, state) => {}
                        () = release_memory() => {}
                        _ = stopped.wait_for(|stop| *stop) => {}
                    }
                });
                // In-flight connections end here; DNS lookups still running in the
                // blocking pool are not waited for beyond this.
                runtime.shutdown_timeout(Duration::from_secs(1));
            })?;
        running.threads.push(thread);
    }
    Ok(running)
}

impl Workers {
    /// Stops accepting, closes the workers' connections and waits for their threads.
    pub fn stop(mut self) {
        let _ = self.stop.send(true);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        // Without waiting: a drop may happen on an async thread.
        let _ = self.stop.send(true);
    }
}
