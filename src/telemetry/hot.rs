//! Metric handles for the request path, looked up once per thread instead of per call.
//!
//! `metrics::counter!(name, labels)` builds a key and hashes it into the recorder's registry
//! on every call: for the two families an egress request records and the two its policy
//! decision records, that was ~6k instructions of a keep-alive request's ~160k (callgrind,
//! `benches/callgrind-egress.sh`). Here each thread keeps the handles it has used, keyed by
//! where its labels' static strings live and by the [`MetricsScope`] it records in (so a
//! pooled thread that runs one gateway's work, then another's, never records into the wrong
//! one); a hit is a short scan of a few words.
//!
//! Contract: the label values are `&'static str` (a fixed set, which is also what keeps a
//! metric's cardinality bounded); each thread keeps at most [`MAX_HANDLES`] handles per
//! kind and looks any further ones up as the macros do.

use std::cell::RefCell;

use metrics::{Counter, Histogram};

use super::MetricsScope;

/// Handles kept per thread and kind; far more than the label sets the request path uses.
const MAX_HANDLES: usize = 64;

/// What a handle was looked up for: the scope, and the addresses and lengths of the
/// metric's name and label strings (static, so equal addresses are equal strings).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Site {
    scope: usize,
    name: (usize, usize),
    labels: [(usize, usize); 4],
}

fn addr(s: &'static str) -> (usize, usize) {
    (s.as_ptr() as usize, s.len())
}

impl Site {
    fn new(name: &'static str, labels: &[(&'static str, &'static str); 2]) -> Site {
        let scope = MetricsScope::current().map_or(0, |s| std::ptr::from_ref(s.0) as usize);
        let [(k1, v1), (k2, v2)] = *labels;
        Site {
            scope,
            name: addr(name),
            labels: [addr(k1), addr(v1), addr(k2), addr(v2)],
        }
    }
}

struct Cache<H> {
    handles: Vec<(Site, H)>,
}

impl<H: Clone> Cache<H> {
    const fn new() -> Cache<H> {
        Cache {
            handles: Vec::new(),
        }
    }

    fn get(&mut self, site: Site, make: impl FnOnce() -> H) -> H {
        if let Some((_, handle)) = self.handles.iter().find(|(s, _)| *s == site) {
            return handle.clone();
        }
        let handle = make();
        if self.handles.len() < MAX_HANDLES {
            self.handles.push((site, handle.clone()));
        }
        handle
    }
}

thread_local! {
    static COUNTERS: RefCell<Cache<Counter>> = const { RefCell::new(Cache::new()) };
    static HISTOGRAMS: RefCell<Cache<Histogram>> = const { RefCell::new(Cache::new()) };
}

/// Unused label slots are this pair, which no metric is given.
const NONE: (&str, &str) = ("", "");

/// `metrics::counter!(name, l1, l2)` through this thread's cache.
pub fn counter(name: &'static str, labels: [(&'static str, &'static str); 2]) -> Counter {
    let site = Site::new(name, &labels);
    COUNTERS.with(|c| {
        c.borrow_mut()
            .get(site, || metrics::counter!(name, &labels[..]))
    })
}

/// `metrics::histogram!(name, label)` through this thread's cache.
pub fn histogram1(name: &'static str, label: (&'static str, &'static str)) -> Histogram {
    let labels = [label, NONE];
    let site = Site::new(name, &labels);
    HISTOGRAMS.with(|c| {
        c.borrow_mut()
            .get(site, || metrics::histogram!(name, &labels[..1]))
    })
}

#[cfg(test)]
#[path = "hot_tests.rs"]
mod tests;
