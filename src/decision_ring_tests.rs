use super::*;

fn ring(max_records: usize, max_bytes: usize) -> Arc<DecisionRing> {
    DecisionRing::new(RingLimits {
        max_records,
        max_bytes,
    })
    .expect("enabled")
}

fn meta<'a>(sandbox: &'a str, workspace: &'a str, decision: &'static str) -> Meta<'a> {
    Meta {
        sandbox: Some(sandbox),
        workspace: Some(workspace),
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
            format!("{{\"n\":{i}}}").as_bytes(),
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
        r.push(meta("sb", "ws", "deny"), &vec![b'x'; len]);
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
    r.push(meta("sb", "ws", "deny"), &vec![b'y'; max + 1]);
    assert_eq!(r.usage(), (count, bytes));
}

#[test]
fn pages_are_newest_first_filtered_and_chained_by_cursor() {
    let r = ring(1000, 1 << 20);
    for i in 0..50u32 {
        let ws = if i % 2 == 0 { "even" } else { "odd" };
        let decision = if i % 5 == 0 { "deny" } else { "allow" };
        r.push(meta(&format!("sb{}", i % 3), ws, decision), b"{}");
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
    r.push(meta("a", "w", "error"), b"{}");
    r.push(meta("a", "w", "allow"), b"{}");
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
        r.push(meta("a", "w", "allow"), b"{}");
    }
    let read = r.after(&Filter::default(), 1, 100);
    assert!(!read.missed);
    assert_eq!(
        read.records.iter().map(|s| s.seq).collect::<Vec<_>>(),
        vec![2, 3]
    );
    assert_eq!(read.cursor, 3);
    for _ in 0..10 {
        r.push(meta("a", "w", "allow"), b"{}");
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

#[test]
fn threads_push_at_once_and_readers_see_one_order() {
    let r = ring(500, 1 << 20);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (r, stop) = (r.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut cursor, mut seen) = (0u64, 0usize);
            loop {
                // One last read after the writers are done, so it reads something.
                let done = stop.load(std::sync::atomic::Ordering::SeqCst);
                let read = r.after(&Filter::default(), cursor, usize::MAX);
                let mut expect = cursor + 1;
                for record in &read.records {
                    assert!(record.seq > cursor, "{} after {cursor}", record.seq);
                    if record.seq != expect {
                        assert!(read.missed || cursor == 0, "a gap without a miss");
                    }
                    expect = record.seq + 1;
                    seen += 1;
                }
                cursor = read.cursor;
                if done {
                    return seen;
                }
            }
        })
    };
    let writers: Vec<_> = (0..4)
        .map(|t| {
            let r = r.clone();
            std::thread::spawn(move || {
                for n in 0..3000 {
                    let json = format!("{{\"n\":{n}}}");
                    r.push(meta(&format!("t{t}"), "ws", "allow"), json.as_bytes());
                    assert!(r.usage().0 <= 500);
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = reader.join().unwrap();
    assert!(seen > 0);
    let read = r.after(&Filter::default(), 0, usize::MAX);
    let (count, bytes) = r.usage();
    assert_eq!(count, 500);
    assert_eq!(read.records.len(), count);
    assert!(read.records.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(read.records.last().unwrap().seq, 12_000);
    assert_eq!(read.records.iter().map(|s| s.cost()).sum::<usize>(), bytes);
    // Pages chained by cursor give the same records newest first.
    let mut paged = Vec::new();
    let mut cursor = None;
    loop {
        let (page, next) = r.page(&Filter::default(), cursor, 7);
        assert!(page.len() <= 7);
        paged.extend(page.iter().map(|s| s.seq));
        match next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    let mut expected: Vec<u64> = read.records.iter().map(|s| s.seq).collect();
    expected.reverse();
    assert_eq!(paged, expected);
}

/// Records of every size written round the arena many times over: each reads back byte
/// for byte (its fields and its line), none overlaps another, and the byte bound holds.
#[test]
fn records_written_round_the_arena_read_back_intact() {
    let max = 8 * 1024;
    let r = ring(1_000_000, max);
    let mut pushed = Vec::new();
    for i in 0..3_000usize {
        let len = (i * 7919) % 1500;
        let sandbox = format!("sb-{}", i % 17);
        let workspace = "ws-ü".repeat(i % 4);
        let json: Vec<u8> = (0..len).map(|j| (i + j) as u8).collect();
        let meta = Meta {
            sandbox: (i % 5 != 0).then_some(sandbox.as_str()),
            workspace: (i % 3 != 0).then_some(workspace.as_str()),
            layer: "egress",
            decision: "allow",
        };
        r.push(meta, &json);
        pushed.push((
            meta.sandbox.map(String::from),
            meta.workspace.map(String::from),
            json,
        ));
        assert!(r.usage().1 <= max);
    }
    let read = r.after(&Filter::default(), 0, usize::MAX);
    assert!(read.records.len() > 5, "{} kept", read.records.len());
    for record in &read.records {
        let (sandbox, workspace, json) = &pushed[record.seq as usize - 1];
        assert_eq!(
            record.sandbox.as_deref(),
            sandbox.as_deref(),
            "{}",
            record.seq
        );
        assert_eq!(
            record.workspace.as_deref(),
            workspace.as_deref(),
            "{}",
            record.seq
        );
        assert_eq!(&*record.json, json.as_slice(), "{}", record.seq);
    }
    // The newest are kept, with no gap between them.
    assert_eq!(read.records.last().unwrap().seq, 3_000);
    assert!(read.records.windows(2).all(|w| w[1].seq == w[0].seq + 1));
    // A record as long as the arena allows evicts everything else, and reads back.
    let whole = vec![b'z'; max - RECORD_OVERHEAD];
    r.push(Meta::default(), &whole);
    let read = r.after(&Filter::default(), 0, usize::MAX);
    assert_eq!(read.records.len(), 1);
    assert_eq!(&*read.records[0].json, whole.as_slice());
    assert_eq!(read.records[0].seq, 3_001);
}
