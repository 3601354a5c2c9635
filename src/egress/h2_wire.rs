//! What an intercepted h2 connection's bytes say about its state, read from outside the h2
//! implementation, so that an idle connection can be taken apart and built again
//! ([`super::park_h2`]).
//!
//! [`Wire`] watches both directions frame by frame (only frame heads, and the payloads of
//! SETTINGS and connection WINDOW_UPDATE frames) and keeps the little a new h2 connection
//! needs to carry on where the old one stopped:
//! - the client's SETTINGS, merged, replayed to the new connection as the client's first
//!   SETTINGS frame;
//! - both connection flow-control windows, as the peers see them on the wire (the new
//!   connection is told the send window by a synthetic client WINDOW_UPDATE; the receive
//!   window is topped up to the new connection's target by a WINDOW_UPDATE sent to the client
//!   at the park);
//! - which streams are open, which SETTINGS and PINGs await their ACK, whether a GOAWAY was
//!   sent, whether a header block is unfinished.
//!
//! It needs to be right only when it says [`Wire::parkable`]; anything it does not follow
//! (a GOAWAY, a flood of streams, a peer that resets streams without end, a window it cannot
//! restore) marks the connection unparkable for good, and it is then served as before.
//!
//! The HPACK dynamic tables are the part that cannot be carried over. The gateway advertises
//! `SETTINGS_HEADER_TABLE_SIZE = 0`, so the client's encoder indexes nothing the new
//! connection's decoder would need. The other way, a new encoder starting empty stays in step
//! with the client's decoder: it refers only to entries it inserted itself, which are the
//! newest in the client's table, and both evict the oldest first.

use std::collections::HashMap;

/// The client connection preface (RFC 9113 §3.4).
pub(crate) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// A connection's flow-control window before any WINDOW_UPDATE (RFC 9113 §6.9.2).
pub(crate) const DEFAULT_WINDOW: i64 = 65_535;
/// Streams the tracker follows at once; beyond it the connection is not parked again.
const MAX_STREAMS: usize = 1024;
/// Streams the gateway may reset over a connection's life and still park it. h2 bounds the
/// streams it resets for a peer's errors per connection; a connection built again starts
/// that count afresh, so parking stops before a peer could use it to reset the bound.
const MAX_LOCAL_RESETS: u64 = 1024;

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PRIORITY: u8 = 0x2;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// Stream bits: the client sent END_STREAM; the gateway did.
const CLIENT_DONE: u8 = 1;
const SERVER_DONE: u8 = 2;

/// Client SETTINGS the tracker keeps: identifiers 1 to 9 (RFC 9113 §6.5.2, RFC 8441,
/// RFC 9218). Others are ignored by h2 and need no replay.
const SETTINGS_KEPT: usize = 9;

/// One frame head (RFC 9113 §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head {
    pub len: u32,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

impl Head {
    fn parse(b: &[u8; 9]) -> Head {
        Head {
            len: u32::from_be_bytes([0, b[0], b[1], b[2]]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.len.to_be_bytes()[1..]);
        out.push(self.kind);
        out.push(self.flags);
        out.extend_from_slice(&self.stream.to_be_bytes());
    }
}

/// What a [`Splitter`] reports while it reads a byte stream.
#[derive(Debug)]
enum Piece<'a> {
    /// A frame head.
    Head(Head),
    /// Bytes of the payload of the frame with this head (never split across frames).
    Payload(Head, &'a [u8]),
    /// The current frame has ended.
    End(Head),
}

/// Cuts one direction's bytes into frames, whatever sizes they arrive in. It holds at most
/// a frame head; payloads are passed through, never gathered.
#[derive(Debug, Default)]
struct Splitter {
    /// Bytes to pass before frames start (the client preface).
    skip: usize,
    head: [u8; 9],
    have: usize,
    current: Option<Head>,
    left: u32,
}

impl Splitter {
    fn feed<'a>(&mut self, mut bytes: &'a [u8], on: &mut impl FnMut(Piece<'a>)) {
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            match self.current {
                None => {
                    let n = (9 - self.have).min(bytes.len());
                    self.head[self.have..self.have + n].copy_from_slice(&bytes[..n]);
                    self.have += n;
                    bytes = &bytes[n..];
                    if self.have == 9 {
                        self.have = 0;
                        let head = Head::parse(&self.head);
                        on(Piece::Head(head));
                        self.start(head, on);
                    }
                }
                Some(head) => {
                    let n = (self.left as usize).min(bytes.len());
                    on(Piece::Payload(head, &bytes[..n]));
                    bytes = &bytes[n..];
                    self.left -= n as u32;
                    if self.left == 0 {
                        self.current = None;
                        on(Piece::End(head));
                    }
                }
            }
        }
    }

    fn start<'a>(&mut self, head: Head, on: &mut impl FnMut(Piece<'a>)) {
        if head.len == 0 {
            on(Piece::End(head));
        } else {
            self.current = Some(head);
            self.left = head.len;
        }
    }

    /// Between frames: no head or payload half read.
    fn at_boundary(&self) -> bool {
        self.skip == 0 && self.have == 0 && self.current.is_none()
    }
}

/// Gathers a small payload (a SETTINGS entry, a WINDOW_UPDATE increment) across pieces.
#[derive(Debug, Default)]
struct Field {
    bytes: [u8; 6],
    have: usize,
}

impl Field {
    /// Takes bytes until `size` are gathered, calling `done` with each whole field.
    fn take(&mut self, mut payload: &[u8], size: usize, done: &mut impl FnMut(&[u8])) {
        while !payload.is_empty() {
            let n = (size - self.have).min(payload.len());
            self.bytes[self.have..self.have + n].copy_from_slice(&payload[..n]);
            self.have += n;
            payload = &payload[n..];
            if self.have == size {
                self.have = 0;
                done(&self.bytes[..size]);
            }
        }
    }
}

/// Which way bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// From the client (sandbox) to the gateway.
    In,
    /// From the gateway to the client.
    Out,
}

/// One direction's reading state.
#[derive(Debug, Default)]
struct Side {
    split: Splitter,
    field: Field,
    /// A header block is unfinished (HEADERS or PUSH_PROMISE without END_HEADERS).
    in_block: bool,
}

/// A connection's state as its bytes tell it (see the module documentation).
#[derive(Debug)]
pub(crate) struct Wire {
    inbound: Side,
    outbound: Side,
    settings: [Option<u32>; SETTINGS_KEPT],
    /// What the client lets the gateway send on the connection.
    send_window: i64,
    /// What the gateway lets the client send on the connection.
    recv_window: i64,
    streams: HashMap<u32, u8>,
    /// The highest stream the client opened (for a GOAWAY the gateway writes itself).
    last_stream: u32,
    /// SETTINGS frames sent without their ACK yet, each way; PINGs likewise.
    settings_unacked_in: i64,
    settings_unacked_out: i64,
    pings_unanswered: i64,
    local_resets: u64,
    /// Never parked again (see the module documentation).
    poisoned: bool,
    /// The streams a park closed for good: ids up to this one (see [`Wire::filter_inbound`]).
    retired: u32,
    /// Bytes of the current inbound frame still to pass, or to drop.
    filter_pass: u32,
    filter_drop: u32,
}

impl Default for Wire {
    fn default() -> Self {
        Wire::new()
    }
}

impl Wire {
    /// The state of a connection before its first byte: the client's bytes start with the
    /// preface.
    pub(crate) fn new() -> Wire {
        let mut inbound = Side::default();
        inbound.split.skip = PREFACE.len();
        Wire {
            inbound,
            outbound: Side::default(),
            settings: [None; SETTINGS_KEPT],
            send_window: DEFAULT_WINDOW,
            recv_window: DEFAULT_WINDOW,
            streams: HashMap::new(),
            last_stream: 0,
            settings_unacked_in: 0,
            settings_unacked_out: 0,
            pings_unanswered: 0,
            local_resets: 0,
            poisoned: false,
            retired: 0,
            filter_pass: 0,
            filter_drop: 0,
        }
    }

    /// Marks every stream opened so far as retired: a connection built again has never
    /// heard of them (called at a park, between frames).
    pub(crate) fn retire(&mut self) {
        self.retired = self.last_stream;
    }

    /// Removes, in place, the frames a client may still send on streams that ended before
    /// the last park: RST_STREAM, WINDOW_UPDATE and PRIORITY, which the old connection
    /// ignored on a closed stream, but which a connection built again takes for frames on
    /// an idle stream, a connection error (curl resets a finished stream lazily, with its next
    /// request). Returns how many bytes are kept at the front of `bytes`, and how many after
    /// them form an unfinished frame head, to be held back and put in front of the next read.
    pub(crate) fn filter_inbound(&mut self, bytes: &mut [u8]) -> (usize, usize) {
        if self.retired == 0 {
            return (bytes.len(), 0);
        }
        let (mut r, mut w) = (0, 0);
        while r < bytes.len() {
            let left = bytes.len() - r;
            if self.filter_pass > 0 {
                let k = (self.filter_pass as usize).min(left);
                if r != w {
                    bytes.copy_within(r..r + k, w);
                }
                (r, w) = (r + k, w + k);
                self.filter_pass -= k as u32;
            } else if self.filter_drop > 0 {
                let k = (self.filter_drop as usize).min(left);
                r += k;
                self.filter_drop -= k as u32;
            } else if left < 9 {
                bytes.copy_within(r.., w);
                return (w, left);
            } else {
                let mut raw = [0u8; 9];
                raw.copy_from_slice(&bytes[r..r + 9]);
                let head = Head::parse(&raw);
                if self.is_retired(head) {
                    r += 9;
                    self.filter_drop = head.len;
                } else {
                    bytes.copy_within(r..r + 9, w);
                    (r, w) = (r + 9, w + 9);
                    self.filter_pass = head.len;
                }
            }
        }
        (w, 0)
    }

    fn is_retired(&self, head: Head) -> bool {
        matches!(head.kind, RST_STREAM | WINDOW_UPDATE | PRIORITY)
            && head.stream != 0
            && head.stream <= self.retired
            && !self.streams.contains_key(&head.stream)
    }

    /// Bytes the client sent, as the gateway's h2 connection reads them.
    pub(crate) fn inbound(&mut self, bytes: &[u8]) {
        self.feed(Dir::In, bytes);
    }

    /// Bytes the gateway's h2 connection wrote to the client.
    pub(crate) fn outbound(&mut self, bytes: &[u8]) {
        self.feed(Dir::Out, bytes);
    }

    fn feed(&mut self, dir: Dir, bytes: &[u8]) {
        let mut side = std::mem::take(self.side(dir));
        let Side {
            split,
            field,
            in_block,
        } = &mut side;
        split.feed(bytes, &mut |piece| match piece {
            Piece::Head(head) => self.head(dir, head, in_block),
            Piece::Payload(head, payload) => self.payload(dir, head, payload, field),
            Piece::End(head) => {
                if field.have != 0 {
                    // A payload that is not a whole number of fields: h2 refuses it.
                    field.have = 0;
                    self.poisoned = true;
                }
                self.end(dir, head);
            }
        });
        *self.side(dir) = side;
    }

    fn side(&mut self, dir: Dir) -> &mut Side {
        match dir {
            Dir::In => &mut self.inbound,
            Dir::Out => &mut self.outbound,
        }
    }

    /// A frame head, counted when it opens (stream, SETTINGS, PING accounting).
    fn head(&mut self, dir: Dir, head: Head, in_block: &mut bool) {
        match head.kind {
            DATA => {
                let len = i64::from(head.len);
                match dir {
                    Dir::In => self.recv_window -= len,
                    Dir::Out => self.send_window -= len,
                }
            }
            HEADERS => {
                *in_block = head.flags & END_HEADERS == 0;
                if dir == Dir::In && !self.streams.contains_key(&head.stream) {
                    self.open(head.stream);
                }
            }
            CONTINUATION => *in_block = head.flags & END_HEADERS == 0,
            RST_STREAM => {
                self.streams.remove(&head.stream);
                if dir == Dir::Out {
                    self.local_resets += 1;
                    self.poisoned |= self.local_resets >= MAX_LOCAL_RESETS;
                }
            }
            SETTINGS => self.settings_frame(dir, head),
            PING => match (dir, head.flags & ACK != 0) {
                (Dir::In, false) => self.pings_unanswered += 1,
                (Dir::Out, true) => self.pings_unanswered -= 1,
                // The gateway sends no PING of its own; one would be outside what parking
                // follows.
                _ => self.poisoned = true,
            },
            GOAWAY | PUSH_PROMISE => self.poisoned = true,
            _ => {}
        }
    }

    fn open(&mut self, stream: u32) {
        if self.streams.len() >= MAX_STREAMS {
            self.poisoned = true;
            self.streams.clear();
            return;
        }
        self.streams.insert(stream, 0);
        self.last_stream = self.last_stream.max(stream);
    }

    fn settings_frame(&mut self, dir: Dir, head: Head) {
        let ack = head.flags & ACK != 0;
        match (dir, ack) {
            (Dir::In, false) => self.settings_unacked_in += 1,
            (Dir::Out, true) => self.settings_unacked_in -= 1,
            (Dir::Out, false) => self.settings_unacked_out += 1,
            (Dir::In, true) => self.settings_unacked_out -= 1,
        }
    }

    /// Payload bytes: the client's SETTINGS entries and connection WINDOW_UPDATEs each way.
    fn payload(&mut self, dir: Dir, head: Head, payload: &[u8], field: &mut Field) {
        match head.kind {
            SETTINGS if dir == Dir::In && head.flags & ACK == 0 => {
                field.take(payload, 6, &mut |entry| {
                    let id = u16::from_be_bytes([entry[0], entry[1]]) as usize;
                    let value = u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]);
                    if (1..=SETTINGS_KEPT).contains(&id) {
                        self.settings[id - 1] = Some(value);
                    }
                });
            }
            WINDOW_UPDATE if head.stream == 0 => {
                field.take(payload, 4, &mut |inc| {
                    let inc = i64::from(
                        u32::from_be_bytes([inc[0], inc[1], inc[2], inc[3]]) & 0x7fff_ffff,
                    );
                    match dir {
                        Dir::In => self.send_window += inc,
                        Dir::Out => self.recv_window += inc,
                    }
                });
            }
            _ => {}
        }
    }

    /// A frame's end: END_STREAM closes its side of the stream.
    fn end(&mut self, dir: Dir, head: Head) {
        if !matches!(head.kind, DATA | HEADERS) || head.flags & END_STREAM == 0 {
            return;
        }
        let bit = match dir {
            Dir::In => CLIENT_DONE,
            Dir::Out => SERVER_DONE,
        };
        if let Some(bits) = self.streams.get_mut(&head.stream) {
            *bits |= bit;
            if *bits == CLIENT_DONE | SERVER_DONE {
                self.streams.remove(&head.stream);
            }
        }
    }

    /// Whether the connection can be taken apart now and built again later, with a receive
    /// window of `target` (the new connection's): nothing open or half-sent, nothing
    /// awaiting an answer, windows a new connection can be told.
    pub(crate) fn parkable(&self, target: i64) -> bool {
        !self.poisoned
            && self.streams.is_empty()
            && self.inbound.split.at_boundary()
            && self.outbound.split.at_boundary()
            && !self.inbound.in_block
            && !self.outbound.in_block
            && self.settings_unacked_in == 0
            && self.settings_unacked_out == 0
            && self.pings_unanswered == 0
            && self.send_window >= DEFAULT_WINDOW
            && self.send_window <= i64::from(i32::MAX)
            && (0..=target).contains(&self.recv_window)
    }

    /// The WINDOW_UPDATE that brings the client's connection window to `target`, written to
    /// the client when the connection parks (a new connection starts out believing the
    /// client may send `target`). Empty when it is there already. Feed it to
    /// [`Wire::outbound`] once written.
    pub(crate) fn top_up(&self, target: i64) -> Vec<u8> {
        let mut out = Vec::new();
        let inc = target - self.recv_window;
        if inc > 0 {
            window_update(&mut out, inc as u32);
        }
        out
    }

    /// What a new connection reads before the client's next bytes, as if the client had just
    /// connected: the preface; the client's SETTINGS as it last set them; an ACK of the
    /// gateway's SETTINGS (the same as the old connection's, which the client acknowledged);
    /// and a WINDOW_UPDATE bringing the send window to what the client allows now.
    pub(crate) fn replay(&self) -> Vec<u8> {
        let mut out = PREFACE.to_vec();
        let entries: Vec<(u16, u32)> = (0..SETTINGS_KEPT)
            .filter_map(|i| self.settings[i].map(|v| (i as u16 + 1, v)))
            .collect();
        Head {
            len: 6 * entries.len() as u32,
            kind: SETTINGS,
            flags: 0,
            stream: 0,
        }
        .encode(&mut out);
        for (id, value) in entries {
            out.extend_from_slice(&id.to_be_bytes());
            out.extend_from_slice(&value.to_be_bytes());
        }
        Head {
            len: 0,
            kind: SETTINGS,
            flags: ACK,
            stream: 0,
        }
        .encode(&mut out);
        let inc = self.send_window - DEFAULT_WINDOW;
        if inc > 0 {
            window_update(&mut out, inc as u32);
        }
        out
    }

    /// A GOAWAY (NO_ERROR) naming the last stream the client opened, for closing a parked
    /// connection the way an h2 server closes an idle one.
    pub(crate) fn goaway(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(17);
        Head {
            len: 8,
            kind: GOAWAY,
            flags: 0,
            stream: 0,
        }
        .encode(&mut out);
        out.extend_from_slice(&self.last_stream.to_be_bytes());
        out.extend_from_slice(&0u32.to_be_bytes());
        out
    }
}

fn window_update(out: &mut Vec<u8>, inc: u32) {
    Head {
        len: 4,
        kind: WINDOW_UPDATE,
        flags: 0,
        stream: 0,
    }
    .encode(out);
    out.extend_from_slice(&inc.to_be_bytes());
}

/// Checks what a new connection writes while it reads [`Wire::replay`], none of which may
/// reach the client: its SETTINGS (the client has the old connection's, the same), the ACK
/// of the replayed client SETTINGS, and, when its receive window target is above the
/// default, the WINDOW_UPDATE that raises it (the client's window was topped up at the
/// park). Anything else means the new connection is not in the state the replay meant.
#[derive(Debug, Default)]
pub(crate) struct Startup {
    split: Splitter,
    settings: u8,
    acks: u8,
    window_updates: u8,
    other: bool,
}

impl Startup {
    pub(crate) fn written(&mut self, bytes: &[u8]) {
        let Startup {
            split,
            settings,
            acks,
            window_updates,
            other,
        } = self;
        split.feed(bytes, &mut |piece| {
            if let Piece::Head(head) = piece {
                match (head.kind, head.flags & ACK != 0, head.stream) {
                    (SETTINGS, false, 0) => *settings += 1,
                    (SETTINGS, true, 0) => *acks += 1,
                    (WINDOW_UPDATE, _, 0) => *window_updates += 1,
                    _ => *other = true,
                }
            }
        });
    }

    /// Every startup frame written, nothing else: the connection can go live.
    /// `Err` when something else was written (the connection cannot be used).
    pub(crate) fn done(&self, window_update: bool) -> Result<bool, ()> {
        let expected_updates = u8::from(window_update);
        if self.other
            || self.settings > 1
            || self.acks > 1
            || self.window_updates > expected_updates
        {
            return Err(());
        }
        Ok(self.split.at_boundary()
            && self.settings == 1
            && self.acks == 1
            && self.window_updates == expected_updates)
    }
}

#[cfg(test)]
#[path = "h2_wire_tests.rs"]
mod tests;
