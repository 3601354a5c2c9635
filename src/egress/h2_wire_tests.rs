use super::*;
use proptest::prelude::*;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    Head {
        len: payload.len() as u32,
        kind,
        flags,
        stream,
    }
    .encode(&mut out);
    out.extend_from_slice(payload);
    out
}

fn settings(entries: &[(u16, u32)]) -> Vec<u8> {
    let mut payload = Vec::new();
    for (id, value) in entries {
        payload.extend_from_slice(&id.to_be_bytes());
        payload.extend_from_slice(&value.to_be_bytes());
    }
    frame(SETTINGS, 0, 0, &payload)
}

fn window(stream: u32, inc: u32) -> Vec<u8> {
    frame(WINDOW_UPDATE, 0, stream, &inc.to_be_bytes())
}

/// A client's start and one finished request with a body, the gateway's answers, as bytes
/// each way.
fn one_exchange() -> (Vec<u8>, Vec<u8>) {
    let mut client = PREFACE.to_vec();
    client.extend(settings(&[(2, 0), (4, 1 << 20), (1, 8192)]));
    client.extend(window(0, 1_000_000));
    client.extend(frame(HEADERS, END_HEADERS, 1, b"hdrs"));
    client.extend(frame(DATA, END_STREAM, 1, &[7u8; 300]));
    client.extend(frame(SETTINGS, ACK, 0, b""));
    let mut server = settings(&[(1, 0), (3, 256)]);
    server.extend(frame(SETTINGS, ACK, 0, b""));
    server.extend(window(0, 983_041));
    server.extend(frame(HEADERS, END_HEADERS, 1, b"resp"));
    server.extend(frame(DATA, END_STREAM, 1, &[1u8; 500]));
    (client, server)
}

#[test]
fn a_finished_exchange_is_parkable_and_its_windows_and_settings_are_kept() {
    let (client, server) = one_exchange();
    let mut wire = Wire::new();
    wire.inbound(&client);
    assert!(!wire.parkable(1 << 20), "the response is not sent yet");
    wire.outbound(&server);
    assert!(wire.parkable(1 << 20));
    assert_eq!(wire.send_window, DEFAULT_WINDOW + 1_000_000 - 500);
    assert_eq!(wire.recv_window, DEFAULT_WINDOW + 983_041 - 300);
    assert_eq!(wire.top_up(1 << 20), window(0, 300));
    // The replay: preface, the client's settings in identifier order, an ACK, the window.
    let mut expected = PREFACE.to_vec();
    expected.extend(settings(&[(1, 8192), (2, 0), (4, 1 << 20)]));
    expected.extend(frame(SETTINGS, ACK, 0, b""));
    expected.extend(window(0, 1_000_000 - 500));
    assert_eq!(wire.replay(), expected);
    assert_eq!(wire.last_stream, 1);
}

#[test]
fn open_streams_unanswered_pings_and_half_frames_are_not_parkable() {
    let (client, server) = one_exchange();
    let parked = |extra_in: &[u8], extra_out: &[u8]| {
        let mut wire = Wire::new();
        wire.inbound(&client);
        wire.outbound(&server);
        wire.inbound(extra_in);
        wire.outbound(extra_out);
        wire.parkable(1 << 20)
    };
    assert!(parked(b"", b""));
    // A stream the client opened and the gateway has not finished.
    assert!(!parked(
        &frame(HEADERS, END_HEADERS | END_STREAM, 3, b"h"),
        b""
    ));
    // ... and once it has.
    assert!(parked(
        &frame(HEADERS, END_HEADERS | END_STREAM, 3, b"h"),
        &frame(HEADERS, END_HEADERS | END_STREAM, 3, b"r")
    ));
    // A stream either side reset is over.
    assert!(parked(
        &frame(HEADERS, END_HEADERS, 3, b"h"),
        &frame(RST_STREAM, 0, 3, &[0, 0, 0, 8])
    ));
    // A header block without its END_HEADERS.
    assert!(!parked(&frame(HEADERS, END_STREAM, 3, b"h"), b""));
    // A PING not answered yet; then answered.
    assert!(!parked(&frame(PING, 0, 0, &[0; 8]), b""));
    assert!(parked(
        &frame(PING, 0, 0, &[0; 8]),
        &frame(PING, ACK, 0, &[0; 8])
    ));
    // A SETTINGS not acknowledged yet.
    assert!(!parked(&settings(&[(4, 100)]), b""));
    // Half a frame head, and half a payload.
    assert!(!parked(&frame(PING, 0, 0, &[0; 8])[..5], b""));
    assert!(!parked(b"", &frame(DATA, 0, 1, &[0; 10])[..12]));
    // A send window below what a new connection assumes.
    assert!(!parked(b"", &frame(DATA, 0, 1, &vec![0; 1_000_000])));
    // GOAWAY either way: never again.
    assert!(!parked(&frame(GOAWAY, 0, 0, &[0; 8]), b""));
}

#[test]
fn a_flood_of_streams_or_local_resets_stops_parking_for_good() {
    let mut wire = Wire::new();
    wire.inbound(PREFACE);
    for i in 0..MAX_STREAMS as u32 + 1 {
        wire.inbound(&frame(HEADERS, END_HEADERS, 2 * i + 1, b"h"));
    }
    assert!(
        wire.poisoned && wire.streams.is_empty(),
        "the map is bounded"
    );
    let mut wire = Wire::new();
    wire.inbound(PREFACE);
    for i in 0..MAX_LOCAL_RESETS as u32 {
        wire.inbound(&frame(HEADERS, END_HEADERS, 2 * i + 1, b"h"));
        wire.outbound(&frame(RST_STREAM, 0, 2 * i + 1, &[0, 0, 0, 7]));
    }
    assert!(!wire.parkable(1 << 20));
}

#[test]
fn frames_of_retired_streams_are_dropped_and_others_kept() {
    let (client, server) = one_exchange();
    let mut wire = Wire::new();
    wire.inbound(&client);
    wire.outbound(&server);
    wire.retire();
    let late_reset = frame(RST_STREAM, 0, 1, &[0, 0, 0, 5]);
    let late_window = window(1, 1000);
    let late_priority = frame(PRIORITY, 0, 1, &[0, 0, 0, 0, 16]);
    let conn_window = window(0, 1000);
    let next = frame(HEADERS, END_HEADERS, 3, b"next");
    let mut bytes = [
        late_reset.clone(),
        conn_window.clone(),
        late_window,
        next.clone(),
        late_priority,
    ]
    .concat();
    let (kept, held) = wire.filter_inbound(&mut bytes);
    assert_eq!(held, 0);
    assert_eq!(bytes[..kept], [conn_window, next].concat()[..]);
}

/// Feeds `bytes` through the filter in the given cuts, as reads would, carrying held-back
/// heads in front of the next cut; returns what h2 would read.
fn filter_in_cuts(wire: &mut Wire, bytes: &[u8], cuts: &[usize]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut carry = Vec::new();
    let mut at = 0;
    let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    bounds.push(bytes.len());
    bounds.sort_unstable();
    for end in bounds {
        let mut read = std::mem::take(&mut carry);
        read.extend_from_slice(&bytes[at..end.max(at)]);
        at = end.max(at);
        let (kept, held) = wire.filter_inbound(&mut read);
        out.extend_from_slice(&read[..kept]);
        carry = read[kept..kept + held].to_vec();
    }
    out
}

/// Everything a wire holds, with its streams in order (a map's own order differs).
fn summary(w: &Wire) -> String {
    let mut streams: Vec<_> = w.streams.iter().collect();
    streams.sort();
    format!(
        "{:?} {} {} {streams:?} {} {} {} {} {} {} {:?} {:?} {:?} {:?}",
        w.settings,
        w.send_window,
        w.recv_window,
        w.last_stream,
        w.settings_unacked_in,
        w.settings_unacked_out,
        w.pings_unanswered,
        w.local_resets,
        w.poisoned,
        w.inbound.split,
        w.outbound.split,
        (w.inbound.in_block, w.inbound.field.have),
        (w.outbound.in_block, w.outbound.field.have),
    )
}

fn arb_frame() -> impl Strategy<Value = Vec<u8>> {
    (
        0u8..10,
        any::<u8>(),
        0u32..8,
        proptest::collection::vec(any::<u8>(), 0..40),
    )
        .prop_map(|(kind, flags, stream, payload)| frame(kind, flags, stream, &payload))
}

proptest! {
    /// However the bytes are cut into reads, the wire ends in the same state as when it
    /// reads them whole, and it never panics, whatever the bytes.
    #[test]
    fn the_wire_does_not_depend_on_how_bytes_are_cut(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let mut whole = Wire::new();
        whole.inbound(&bytes);
        whole.outbound(&bytes);
        let mut cut = Wire::new();
        let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        bounds.push(bytes.len());
        bounds.sort_unstable();
        let mut at = 0;
        for end in bounds {
            cut.inbound(&bytes[at..end]);
            cut.outbound(&bytes[at..end]);
            at = end;
        }
        prop_assert_eq!(summary(&whole), summary(&cut));
        let _ = whole.parkable(1 << 20);
        let _ = whole.replay();
        let _ = whole.top_up(1 << 20);
    }

    /// The filter drops exactly the retired streams' late frames, whole, however the reads
    /// are cut.
    #[test]
    fn the_filter_drops_whole_retired_frames_in_any_cut(
        frames in proptest::collection::vec(arb_frame(), 0..20),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let bytes = frames.concat();
        let mut wire = Wire::new();
        wire.inbound(PREFACE);
        for stream in [1u32, 3] {
            wire.inbound(&frame(HEADERS, END_HEADERS | END_STREAM, stream, b"h"));
            wire.outbound(&frame(HEADERS, END_HEADERS | END_STREAM, stream, b"r"));
        }
        wire.retire();
        let expected: Vec<u8> = frames
            .iter()
            .filter(|f| {
                let head = Head::parse(f[..9].try_into().unwrap());
                !(matches!(head.kind, RST_STREAM | WINDOW_UPDATE | PRIORITY)
                    && (1..=3).contains(&head.stream))
            })
            .flatten()
            .copied()
            .collect();
        let got = filter_in_cuts(&mut wire, &bytes, &cuts);
        prop_assert_eq!(got, expected);
    }

    /// Arbitrary bytes through the filter: no panic, never more bytes out than in.
    #[test]
    fn the_filter_takes_any_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let mut wire = Wire::new();
        wire.inbound(PREFACE);
        wire.inbound(&frame(HEADERS, END_HEADERS | END_STREAM, 5, b"h"));
        wire.outbound(&frame(HEADERS, END_HEADERS | END_STREAM, 5, b"r"));
        wire.retire();
        let got = filter_in_cuts(&mut wire, &bytes, &cuts);
        prop_assert!(got.len() <= bytes.len());
    }
}

#[test]
fn startup_accepts_exactly_the_new_connections_opening_frames() {
    let opening = [
        settings(&[(1, 0)]),
        frame(SETTINGS, ACK, 0, b""),
        window(0, 983_041),
    ];
    let mut check = Startup::default();
    for (i, f) in opening.iter().enumerate() {
        assert_eq!(check.done(true), Ok(false), "after {i} frames");
        // Written in two pieces, as a write may be.
        check.written(&f[..4]);
        check.written(&f[4..]);
    }
    assert_eq!(check.done(true), Ok(true));
    // Without a window update expected, one is unexpected.
    assert_eq!(check.done(false), Err(()));
    // Anything else is refused.
    let mut check = Startup::default();
    check.written(&frame(HEADERS, END_HEADERS, 1, b"x"));
    assert_eq!(check.done(true), Err(()));
}
