use super::*;

fn ring(max_records: usize, max_bytes: usize) -> Arc<DecisionRing> {
    DecisionRing::new(RingLimits {
        max_records,
        max_bytes,
    })
    .expect("enabled")
}

fn meta(sandbox: &str, workspace: &str, decision: &'static str) -> Meta {
    Meta {
        sandbox: Some(sandbox.into()),
        workspace: Some(workspace.into()),
        layer: "egress",
        decision,
    }
}

#[test]
fn zero_disables() {
    for (records, bytes) in [(0, 1 << 20), (10, 0)] {
        assert!(DecisionRing::new(RingLimits {
            max_records: records,
            max_bytes: bytes
        })
        .is_none());
    }
}

#[test]
fn the_count_bound_holds_under_many_records() {
    let r = ring(100, 1 << 30);
    for i in 0..10_000u32 {
        r.push(
            meta("sb", "ws", "allow"),
            format!("{{\"n\":{i}}}").into_bytes().into(),
        );
        assert!(r.usage().0 <= 100);
    }
    let (page, _) = r.page(&Filter::default(), None, 500);
    assert_eq!(page.len(), 100);
    // The newest survive, newest first.
    assert_eq!(page[0].seq, 10_000);
    assert_eq!(page[99].seq, 9_901);
    assert_eq!(&*page[0].json, b"{\"n\":9999}");
}

#[test]
fn the_byte_bound_holds_under_many_records_of_any_size() {
    let max = 64 * 1024;
    let r = ring(1_000_000, max);
    let mut sizes = 0usize;
    for i in 0..5_000usize {
        let len = (i * 7919) % 4000;
        r.push(meta("sb", "ws", "deny"), vec![b'x'; len].into());
        sizes += len;
        let (_, bytes) = r.usage();
        assert!(bytes <= max, "{bytes} > {max}");
    }
    assert!(sizes > 10 * max);
    // Accounting matches what is held.
    let (count, bytes) = r.usage();
    let (page, _) = r.page(&Filter::default(), None, usize::MAX);
    assert_eq!(page.len(), count);
    assert_eq!(page.iter().map(|s| s.cost()).sum::<usize>(), bytes);
    // A record bigger than the whole bound is not kept, and evicts nothing.
    r.push(meta("sb", "ws", "deny"), vec![b'y'; max + 1].into());
    assert_eq!(r.usage(), (count, bytes));
}

#[test]
fn pages_are_newest_first_filtered_and_chained_by_cursor() {
    let r = ring(1000, 1 << 20);
    for i in 0..50u32 {
        let ws = if i % 2 == 0 { "even" } else { "odd" };
        let decision = if i % 5 == 0 { "deny" } else { "allow" };
        r.push(
            meta(&format!("sb{}", i % 3), ws, decision),
            b"{}".as_slice().into(),
        );
    }
    let filter = Filter {
        workspace: Some("even".into()),
        ..Filter::default()
    };
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let (page, next) = r.page(&filter, cursor, 7);
        assert!(page.len() <= 7);
        seen.extend(page.iter().map(|s| s.seq));
        match next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    let expected: Vec<u64> = (1..=50u64).rev().filter(|s| (s - 1) % 2 == 0).collect();
    assert_eq!(seen, expected);
    let denials = Filter {
        decision: Some("deny".into()),
        sandbox: Some("sb0".into()),
        ..Filter::default()
    };
    let (page, next) = r.page(&denials, None, 100);
    assert_eq!(next, None);
    // i % 5 == 0 and i % 3 == 0: i in {0, 15, 30, 45}.
    assert_eq!(
        page.iter().map(|s| s.seq).collect::<Vec<_>>(),
        vec![46, 31, 16, 1]
    );
}

#[test]
fn deny_matches_errors_and_since_cuts_older_records() {
    let r = ring(10, 1 << 20);
    r.push(meta("a", "w", "error"), b"{}".as_slice().into());
    r.push(meta("a", "w", "allow"), b"{}".as_slice().into());
    let deny = Filter {
        decision: Some("deny".into()),
        ..Filter::default()
    };
    assert_eq!(r.page(&deny, None, 10).0.len(), 1);
    let future = Filter {
        since_ms: Some(u64::MAX),
        ..Filter::default()
    };
    assert!(r.page(&future, None, 10).0.is_empty());
}

#[test]
fn after_reads_on_from_a_cursor_and_reports_what_was_missed() {
    let r = ring(5, 1 << 20);
    for _ in 0..3 {
        r.push(meta("a", "w", "allow"), b"{}".as_slice().into());
    }
    let read = r.after(&Filter::default(), 1, 100);
    assert!(!read.missed);
    assert_eq!(
        read.records.iter().map(|s| s.seq).collect::<Vec<_>>(),
        vec![2, 3]
    );
    assert_eq!(read.cursor, 3);
    for _ in 0..10 {
        r.push(meta("a", "w", "allow"), b"{}".as_slice().into());
    }
    // Records 4..=8 were evicted before being read.
    let read = r.after(&Filter::default(), 3, 2);
    assert!(read.missed);
    assert_eq!(
        read.records.iter().map(|s| s.seq).collect::<Vec<_>>(),
        vec![9, 10]
    );
    assert_eq!(read.cursor, 10);
    // Nothing matches: the cursor still moves to the newest record.
    let none = Filter {
        sandbox: Some("nobody".into()),
        ..Filter::default()
    };
    let read = r.after(&none, 10, 100);
    assert!(read.records.is_empty());
    assert_eq!(read.cursor, 13);
    // A cursor from an earlier process (past the newest) reads on from now.
    let read = r.after(&Filter::default(), 1_000, 100);
    assert!(read.records.is_empty() && !read.missed);
    assert_eq!(read.cursor, 13);
}

/// A deferred record that counts its renderings and says it holds `held` bytes.
struct Counted {
    sandbox: String,
    line: String,
    held: usize,
    renders: Arc<std::sync::atomic::AtomicUsize>,
}

impl Deferred for Counted {
    fn sandbox(&self) -> Option<&str> {
        Some(&self.sandbox)
    }
    fn workspace(&self) -> Option<&str> {
        Some("ws")
    }
    fn held_bytes(&self) -> usize {
        self.held
    }
    fn render(&self, out: &mut Vec<u8>) {
        self.renders
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        out.extend_from_slice(self.line.as_bytes());
    }
}

fn counted(
    sandbox: &str,
    n: usize,
    held: usize,
    renders: &Arc<std::sync::atomic::AtomicUsize>,
) -> Box<dyn Deferred> {
    Box::new(Counted {
        sandbox: sandbox.into(),
        line: format!("{{\"n\":{n}}}"),
        held,
        renders: renders.clone(),
    })
}

fn renders(counter: &Arc<std::sync::atomic::AtomicUsize>) -> usize {
    counter.load(std::sync::atomic::Ordering::SeqCst)
}

#[test]
fn deferred_records_are_rendered_once_when_read_and_never_when_evicted_unread() {
    let r = ring(100, 1 << 20);
    let count = Arc::default();
    for n in 0..300 {
        let sandbox = if n % 2 == 0 { "a" } else { "b" };
        r.push_deferred("egress", "allow", counted(sandbox, n, 64, &count));
    }
    // 200 were evicted, none rendered.
    assert_eq!(r.usage(), (100, 100 * (64 + RECORD_OVERHEAD)));
    assert_eq!(renders(&count), 0);
    let only_a = Filter {
        sandbox: Some("a".into()),
        ..Filter::default()
    };
    let (page, next) = r.page(&only_a, None, 10);
    assert_eq!(page.len(), 10);
    assert_eq!(next, Some(page[9].seq));
    assert_eq!(&*page[0].json, b"{\"n\":298}");
    assert_eq!(&*page[9].json, b"{\"n\":280}");
    assert_eq!(page[0].sandbox.as_deref(), Some("a"));
    assert_eq!(page[0].workspace.as_deref(), Some("ws"));
    // Only what matched and was returned was rendered; the b records between stay waiting.
    assert_eq!(renders(&count), 10);
    assert_eq!(r.page(&only_a, None, 10).0[3].json, page[3].json);
    assert_eq!(renders(&count), 10, "a record is rendered once");
    // The stream's read renders the rest, oldest first; accounting follows the lines.
    let read = r.after(&Filter::default(), 0, 1000);
    assert_eq!(read.records.len(), 100);
    assert_eq!(&*read.records[0].json, b"{\"n\":200}");
    assert_eq!(read.cursor, 300);
    assert_eq!(renders(&count), 100);
    let (count_now, bytes) = r.usage();
    assert_eq!(count_now, 100);
    assert_eq!(read.records.iter().map(|s| s.cost()).sum::<usize>(), bytes);
}

#[test]
fn waiting_and_rendered_records_share_one_order_and_one_bound() {
    let r = ring(1000, 4096);
    let count = Arc::default();
    for n in 0..40 {
        if n % 3 == 0 {
            r.push(
                meta("a", "ws", "deny"),
                format!("{{\"n\":{n}}}").into_bytes().into(),
            );
        } else {
            r.push_deferred("egress", "deny", counted("a", n, 100, &count));
        }
        assert!(r.usage().1 <= 4096);
    }
    let read = r.after(&Filter::default(), 0, 1000);
    let seqs: Vec<u64> = read.records.iter().map(|s| s.seq).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    assert_eq!(*seqs.last().unwrap(), 40);
    for record in &read.records {
        let n = record.seq - 1;
        assert_eq!(&*record.json, format!("{{\"n\":{n}}}").as_bytes());
    }
    // A record charged less than its line turns out to be: the bound still holds after
    // it is rendered, by evicting the oldest.
    let r = ring(1000, 2048);
    let long = || {
        Box::new(Counted {
            sandbox: "a".into(),
            line: format!("\"{}\"", "x".repeat(900)),
            held: 10,
            renders: Arc::default(),
        })
    };
    for _ in 0..8 {
        r.push_deferred("egress", "allow", long());
    }
    let read = r.after(&Filter::default(), 0, 1000);
    assert_eq!(read.records.len(), 8, "every record read was returned");
    let (kept, bytes) = r.usage();
    assert!(bytes <= 2048, "{bytes}");
    assert!(kept < 8);
}

#[test]
fn waiting_records_are_rendered_when_due_even_with_nobody_asking() {
    let r = ring(1000, 1 << 20);
    let count = Arc::default();
    r.push_deferred("egress", "allow", counted("a", 0, 64, &count));
    r.render_due();
    assert_eq!(renders(&count), 0, "a new record is not due");
    std::thread::sleep(DEFERRED_FOR + Duration::from_millis(50));
    r.push_deferred("egress", "allow", counted("a", 1, 64, &count));
    r.render_due();
    assert_eq!(
        renders(&count),
        1,
        "only the record older than DEFERRED_FOR"
    );
    r.render_due();
    assert_eq!(renders(&count), 1, "nothing is rendered twice");
    // The ring's own thread renders the second once it is due.
    std::thread::sleep(DEFERRED_FOR + DEFERRED_FOR / 4 + Duration::from_millis(200));
    assert_eq!(renders(&count), 2);
    let (_, bytes) = r.usage();
    let (page, _) = r.page(&Filter::default(), None, 10);
    assert_eq!(page.iter().map(|s| s.cost()).sum::<usize>(), bytes);
    assert_eq!(renders(&count), 2);
}

#[test]
fn threads_push_into_their_own_shards_and_readers_see_one_order() {
    let r = ring(500, 1 << 20);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (r, stop) = (r.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut cursor, mut seen, mut gaps) = (0u64, 0usize, 0usize);
            loop {
                // One last read after the writers are done, so it reads something.
                let done = stop.load(std::sync::atomic::Ordering::SeqCst);
                let read = r.after(&Filter::default(), cursor, usize::MAX);
                let mut expect = cursor + 1;
                for record in &read.records {
                    assert!(record.seq > cursor, "{} after {cursor}", record.seq);
                    if record.seq != expect {
                        assert!(read.missed || cursor == 0, "a gap without a miss");
                        gaps += 1;
                    }
                    expect = record.seq + 1;
                    seen += 1;
                }
                cursor = read.cursor;
                if done {
                    return (seen, gaps);
                }
            }
        })
    };
    let writers: Vec<_> = (0..4)
        .map(|t| {
            let r = r.clone();
            std::thread::spawn(move || {
                let count = Arc::default();
                for n in 0..3000 {
                    if n % 2 == 0 {
                        r.push(
                            meta(&format!("t{t}"), "ws", "allow"),
                            b"{}".as_slice().into(),
                        );
                    } else {
                        r.push_deferred(
                            "egress",
                            "allow",
                            counted(&format!("t{t}"), n, 40, &count),
                        );
                    }
                    // Between a push and its eviction another thread's push may be counted.
                    let records = r.records.load(std::sync::atomic::Ordering::Relaxed);
                    assert!(records <= 500 + 4, "{records}");
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (seen, _) = reader.join().unwrap();
    assert!(seen > 0);
    let read = r.after(&Filter::default(), 0, usize::MAX);
    let (count, bytes) = r.usage();
    assert!(count <= 500, "{count}");
    assert_eq!(read.records.len(), count);
    assert!(read.records.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(read.records.last().unwrap().seq, 12_000);
    assert_eq!(read.records.iter().map(|s| s.cost()).sum::<usize>(), bytes);
}
