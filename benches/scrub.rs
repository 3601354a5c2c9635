//! What `scrub_response_body` costs: the streaming scrubber over a text body, beside a plain
//! copy of the same chunks (the work a proxy does for a body it does not scrub) in the same
//! run. Prints MB/s (median of the repeats) and the ratio to the copy.
//!
//! `cargo bench --bench scrub`; `SANDGATE_BENCH_MB` (default 64) sets the body size,
//! `SANDGATE_BENCH_REPEATS` (default 5) the repeats.

use std::sync::Arc;
use std::time::Instant;

use sandgate::credentials::scrub::{Scrubber, StreamScrub};
use sandgate::credentials::Secret;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A JSON-like text body with the secret in it about once per 64 KiB.
fn body(megabytes: usize, secret: &str) -> Vec<u8> {
    let line = br#"{"id": 1234567, "name": "build-artifact", "state": "ok", "url": "https://example.test/a/b/c"},"#;
    let mut out = Vec::with_capacity(megabytes << 20);
    let mut since = 0;
    while out.len() < megabytes << 20 {
        out.extend_from_slice(line);
        since += line.len();
        if since > 64 << 10 {
            out.extend_from_slice(secret.as_bytes());
            since = 0;
        }
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn run(body: &[u8], chunk: usize, scrubbers: &[Arc<Scrubber>]) -> (f64, usize) {
    let started = Instant::now();
    let mut out = 0usize;
    let mut held = 0usize;
    if scrubbers.is_empty() {
        for c in body.chunks(chunk) {
            out += bytes::Bytes::copy_from_slice(c).len();
        }
    } else {
        let mut stream = StreamScrub::new(scrubbers.to_vec());
        for c in body.chunks(chunk) {
            out += stream.push(c).len();
            held = held.max(stream.held());
        }
        out += stream.finish().len();
    }
    std::hint::black_box(out);
    let secs = started.elapsed().as_secs_f64();
    (body.len() as f64 / secs / 1e6, held)
}

fn main() {
    let megabytes = env("SANDGATE_BENCH_MB", 64);
    let repeats = env("SANDGATE_BENCH_REPEATS", 5);
    // The scan skips ahead on the first bytes of the secret's forms: a secret whose forms
    // start with bytes that are rare in the body ("ghp_", base64 "Z2hw") scans far faster
    // than one whose forms start with common letters ("sk-", base64 "c2st").
    let secrets = [
        (
            "one, rare first bytes",
            vec!["ghp_0123456789abcdefABCDEF0123456789abcd"],
        ),
        (
            "one, common first bytes",
            vec!["sk-live-9f8e7d6c5b4a39281706f5e4d3c2b1a0"],
        ),
        (
            "three",
            vec![
                "ghp_0123456789abcdefABCDEF0123456789abcd",
                "sk-live-9f8e7d6c5b4a39281706f5e4d3c2b1a0",
                "xoxb-1111111111-2222222222-abcdefghijklmnop",
            ],
        ),
    ];
    let data = body(megabytes, secrets[0].1[0]);
    println!("scrub bench: {megabytes} MiB text body, median of {repeats}");
    println!(
        "{:<36} {:>7} {:>10} {:>8} {:>12}",
        "route", "chunk", "MB/s", "ratio", "max held B"
    );
    for chunk in [16 << 10, 1 << 10] {
        let copy = median((0..repeats).map(|_| run(&data, chunk, &[]).0).collect());
        println!(
            "{:<36} {:>7} {:>10.0} {:>8} {:>12}",
            "copy (no scrubbing)", chunk, copy, "1.00", 0
        );
        for (label, list) in &secrets {
            let scrubbers: Vec<Arc<Scrubber>> = list
                .iter()
                .map(|s| Arc::new(Scrubber::new(&Secret::new(*s), Some("bot"))))
                .collect();
            let results: Vec<(f64, usize)> = (0..repeats)
                .map(|_| run(&data, chunk, &scrubbers))
                .collect();
            let held = results.iter().map(|r| r.1).max().unwrap_or(0);
            let speed = median(results.into_iter().map(|r| r.0).collect());
            println!(
                "{:<36} {:>7} {:>10.0} {:>8.2} {:>12}",
                format!("scrub: {label}"),
                chunk,
                speed,
                speed / copy,
                held
            );
        }
    }
}
