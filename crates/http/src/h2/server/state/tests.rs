//! The connection driven frame by frame as a client would, the answers read back with
//! the frame parser and loona-hpack's decoder: requests and their checks, flow control
//! both ways, field blocks in pieces, every error where section 5.4 puts it, and the
//! floods (rapid reset, empty frames, CONTINUATION, HPACK bombs, too many streams).

use super::*;
use crate::h2::frame::write;

/// A client: frames written with the crate's writers (and raw heads where a writer
/// would refuse), requests encoded by loona-hpack (an independent encoder).
struct Client {
    conn: Connection,
    hpack: loona_hpack::Encoder<'static>,
    events: Vec<String>,
    /// What the server sent, not yet read.
    out: Vec<u8>,
    error: Option<ConnectionError>,
}

fn raw_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Head {
        len: payload.len() as u32,
        kind,
        flags,
        stream,
    }
    .encode()
    .to_vec();
    out.extend_from_slice(payload);
    out
}

impl Client {
    fn with(config: Config) -> Self {
        let mut out = Vec::new();
        let mut conn = Connection::new(config, &mut out);
        // As the server does while its worker's budget allows.
        conn.open_connection_window(conn.connection_window_wanted(), &mut out);
        let mut client = Self {
            conn,
            hpack: loona_hpack::Encoder::new(),
            events: Vec::new(),
            out,
            error: None,
        };
        let mut hello = PREFACE.to_vec();
        write::settings(&mut hello, &[]);
        client.send(&hello);
        let frames = client.frames();
        assert_eq!(
            frames[0].0.kind,
            kind::SETTINGS,
            "the server's SETTINGS first"
        );
        assert!(frames
            .iter()
            .any(|(h, _)| h.kind == kind::SETTINGS && h.has(flags::ACK)));
        client
    }

    fn new() -> Self {
        Self::with(Config::default())
    }

    /// Feeds bytes, one byte at a time when asked (frames split anywhere).
    fn send(&mut self, bytes: &[u8]) {
        let events = &mut self.events;
        let mut on = |e: Event<'_>| events.push(describe(&e));
        match self.conn.receive(bytes, &mut self.out, &mut on) {
            Ok(n) => assert_eq!(n, bytes.len(), "whole frames taken"),
            Err(e) => self.error = Some(e),
        }
    }

    fn request(&mut self, stream: u32, fields: &[(&str, &str)], end_stream: bool) {
        let block = self.block(fields);
        let mut frame = Vec::new();
        write::headers(&mut frame, stream, &block, end_stream);
        self.send(&frame);
    }

    fn block(&mut self, fields: &[(&str, &str)]) -> Vec<u8> {
        self.hpack
            .encode(fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())))
    }

    fn get(&mut self, stream: u32) {
        self.request(stream, &GET, true);
    }

    /// The frames the server sent since last asked.
    fn frames(&mut self) -> Vec<(Head, Vec<u8>)> {
        let mut frames = Vec::new();
        let mut rest = &self.out[..];
        while !rest.is_empty() {
            let head = Head::parse(rest[..9].try_into().unwrap());
            frames.push((head, rest[9..9 + head.len as usize].to_vec()));
            rest = &rest[9 + head.len as usize..];
        }
        self.out.clear();
        frames
    }

    fn take_events(&mut self) -> Vec<String> {
        std::mem::take(&mut self.events)
    }

    fn goaway(&mut self) -> Option<ErrorCode> {
        self.frames().iter().find_map(|(h, p)| {
            (h.kind == kind::GOAWAY)
                .then(|| ErrorCode::from(u32::from_be_bytes(p[4..8].try_into().unwrap())))
        })
    }

    fn resets(&mut self) -> Vec<(u32, ErrorCode)> {
        self.frames()
            .iter()
            .filter(|(h, _)| h.kind == kind::RST_STREAM)
            .map(|(h, p)| {
                (
                    h.stream,
                    ErrorCode::from(u32::from_be_bytes(p[..4].try_into().unwrap())),
                )
            })
            .collect()
    }
}

const GET: [(&str, &str); 4] = [
    (":method", "GET"),
    (":scheme", "https"),
    (":path", "/"),
    (":authority", "example.com"),
];

fn describe(e: &Event<'_>) -> String {
    match e {
        Event::Request {
            stream,
            head,
            end_stream,
        } => {
            let fields: Vec<String> = head
                .fields()
                .map(|f| format!("{}={}", show(f.name), show(f.value)))
                .collect();
            format!(
                "request {stream} {} {} {}{}{}",
                show(head.method()),
                show(head.path().unwrap_or(b"-")),
                show(head.authority().unwrap_or(b"-")),
                if *end_stream { " end" } else { "" },
                if fields.is_empty() {
                    String::new()
                } else {
                    format!(" [{}]", fields.join(" "))
                }
            )
        }
        Event::Data {
            stream,
            data,
            end_stream,
        } => format!(
            "data {stream} {}{}",
            data.len(),
            if *end_stream { " end" } else { "" }
        ),
        Event::Trailers { stream, fields } => {
            format!("trailers {stream} {}", fields.fields().count())
        }
        Event::Reset { stream, code, .. } => format!("reset {stream} {code:?}"),
        Event::Refused { stream, reason, .. } => format!("refused {stream} {reason:?}"),
        Event::WindowOpened => "window".into(),
        Event::GoAway { last_stream, code } => format!("goaway {last_stream} {code:?}"),
    }
}

fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn a_request_is_parsed_and_answered() {
    let mut c = Client::new();
    c.request(
        1,
        &[
            (":method", "POST"),
            (":scheme", "https"),
            (":path", "/upload?x=1"),
            (":authority", "example.com"),
            ("content-length", "5"),
            ("cookie", "a=1"),
        ],
        false,
    );
    let mut data = Vec::new();
    write::data(&mut data, 1, b"hello", true);
    c.send(&data);
    assert_eq!(
        c.take_events(),
        [
            "request 1 POST /upload?x=1 example.com [content-length=5 cookie=a=1]",
            "data 1 5 end"
        ]
    );
    let mut out = Vec::new();
    assert!(c.conn.send_head(1, false, &mut out, |b| {
        encoder::status(200, b);
        encoder::field(b"server", b"terminus", b);
    }));
    assert_eq!(c.conn.send_data(1, b"world", true, &mut out), 5);
    assert!(c.conn.is_idle(), "both ends closed: forgotten");
    c.out = out;
    let frames = c.frames();
    assert_eq!(frames.len(), 2);
    assert_eq!(frames[0].0.kind, kind::HEADERS);
    assert!(frames[0].0.has(flags::END_HEADERS) && !frames[0].0.has(flags::END_STREAM));
    let fields = loona_hpack::Decoder::new().decode(&frames[0].1).unwrap();
    assert_eq!(
        fields,
        [
            (b":status".to_vec(), b"200".to_vec()),
            (b"server".to_vec(), b"terminus".to_vec())
        ]
    );
    assert_eq!(
        (frames[1].0.kind, &frames[1].1[..]),
        (kind::DATA, &b"world"[..])
    );
    assert!(frames[1].0.has(flags::END_STREAM));
    assert!(
        !c.conn.send_head(1, true, &mut Vec::new(), |_| {}),
        "a closed stream takes nothing more"
    );
}

#[test]
fn frames_split_anywhere_are_taken_whole() {
    let mut c = Client::new();
    let block = c.block(&GET);
    let mut bytes = Vec::new();
    write::headers(&mut bytes, 1, &block, true);
    write::headers(&mut bytes, 3, &c.block(&GET), true);
    let mut events = Vec::new();
    let mut buffered: Vec<u8> = Vec::new();
    for &b in &bytes {
        buffered.push(b);
        let n = c
            .conn
            .receive(&buffered, &mut c.out, &mut |e: Event<'_>| {
                events.push(describe(&e))
            })
            .unwrap();
        buffered.drain(..n);
    }
    assert!(buffered.is_empty());
    assert_eq!(
        events,
        [
            "request 1 GET / example.com end",
            "request 3 GET / example.com end"
        ]
    );
}

#[test]
fn a_field_block_in_pieces_is_joined_and_nothing_may_come_between() {
    let mut c = Client::new();
    let block = c.block(&GET);
    let (a, b) = block.split_at(3);
    let mut bytes = raw_frame(kind::HEADERS, flags::END_STREAM, 1, a);
    bytes.extend(raw_frame(kind::CONTINUATION, 0, 1, &b[..1]));
    bytes.extend(raw_frame(
        kind::CONTINUATION,
        flags::END_HEADERS,
        1,
        &b[1..],
    ));
    c.send(&bytes);
    assert_eq!(c.take_events(), ["request 1 GET / example.com end"]);
    // A PING in the middle of a block ends the connection.
    let block = c.block(&GET);
    let mut bytes = raw_frame(kind::HEADERS, flags::END_STREAM, 3, &block[..2]);
    bytes.extend(raw_frame(kind::PING, 0, 0, &[0; 8]));
    c.send(&bytes);
    assert_eq!(c.error.map(|e| e.code), Some(ErrorCode::ProtocolError));
    assert_eq!(c.goaway(), Some(ErrorCode::ProtocolError));
}

#[test]
fn the_preface_and_first_settings_are_required() {
    let mut out = Vec::new();
    let mut conn = Connection::new(Config::default(), &mut out);
    let mut on = |_: Event<'_>| {};
    assert_eq!(
        conn.receive(b"PRI * HTTP/2.0\r\n", &mut out, &mut on),
        Ok(0)
    );
    let e = conn.receive(b"GET / HTTP/1.1\r\n\r\n", &mut out, &mut on);
    assert_eq!(e.map_err(|e| e.code), Err(ErrorCode::ProtocolError));
    let mut conn = Connection::new(Config::default(), &mut out);
    let mut bytes = PREFACE.to_vec();
    write::ping_ack(&mut bytes, [0; 8]);
    let e = conn.receive(&bytes, &mut out, &mut on);
    assert_eq!(e.map_err(|e| e.code), Err(ErrorCode::ProtocolError));
}

/// Section 8: each malformed request costs its stream alone (RST_STREAM
/// PROTOCOL_ERROR), and the next request on the connection is served.
#[test]
fn malformed_requests_are_reset_and_the_connection_goes_on() {
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, bool);
    let cases: Vec<Case> = vec![
        ("upper-case name", vec![("X-Up", "1")], true),
        ("connection field", vec![("connection", "keep-alive")], true),
        ("te other than trailers", vec![("te", "gzip")], true),
        (
            "transfer-encoding",
            vec![("transfer-encoding", "chunked")],
            true,
        ),
        (
            "pseudo after regular",
            vec![("x", "1"), (":foo", "1")],
            true,
        ),
        ("value with a leading space", vec![("x", " 1")], true),
        (
            "content-length with END_STREAM",
            vec![("content-length", "3")],
            true,
        ),
        (
            "content-length not a number",
            vec![("content-length", "3x")],
            false,
        ),
        (
            "two content-lengths",
            vec![("content-length", "1"), ("content-length", "2")],
            false,
        ),
    ];
    let mut c = Client::new();
    let mut id = 1;
    for (why, extra, end_stream) in cases {
        let mut fields = GET.to_vec();
        fields.extend(extra);
        c.request(id, &fields, end_stream);
        assert_eq!(
            c.take_events(),
            [format!("refused {id} Malformed")],
            "{why}"
        );
        assert_eq!(c.resets(), [(id, ErrorCode::ProtocolError)], "{why}");
        id += 2;
    }
    for (why, fields) in [
        ("no :path", vec![(":method", "GET"), (":scheme", "https")]),
        (
            "empty :path",
            vec![(":method", "GET"), (":scheme", "https"), (":path", "")],
        ),
        (
            "relative :path",
            vec![(":method", "GET"), (":scheme", "https"), (":path", "x")],
        ),
        (
            "two :method",
            vec![
                (":method", "GET"),
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
            ],
        ),
        (
            "a response pseudo",
            vec![
                (":status", "200"),
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/"),
            ],
        ),
        (
            "CONNECT with :path",
            vec![
                (":method", "CONNECT"),
                (":authority", "a:443"),
                (":path", "/"),
            ],
        ),
        (
            ":protocol not enabled",
            vec![
                (":method", "CONNECT"),
                (":protocol", "websocket"),
                (":scheme", "https"),
                (":path", "/"),
                (":authority", "a"),
            ],
        ),
    ] {
        c.request(id, &fields, true);
        assert_eq!(
            c.take_events(),
            [format!("refused {id} Malformed")],
            "{why}"
        );
        assert_eq!(c.resets(), [(id, ErrorCode::ProtocolError)], "{why}");
        id += 2;
    }
    c.get(id);
    assert_eq!(
        c.take_events(),
        [format!("request {id} GET / example.com end")]
    );
    assert!(c.error.is_none());
}

#[test]
fn a_body_must_add_up_to_its_content_length() {
    let mut c = Client::new();
    let mut fields = GET.to_vec();
    fields[0] = (":method", "POST");
    fields.push(("content-length", "4"));
    c.request(1, &fields, false);
    let mut data = Vec::new();
    write::data(&mut data, 1, b"abc", true);
    c.send(&data);
    assert_eq!(c.take_events()[1], "reset 1 ProtocolError");
    c.request(3, &fields, false);
    let mut data = Vec::new();
    write::data(&mut data, 3, b"abcde", false);
    c.send(&data);
    assert_eq!(c.take_events()[1], "reset 3 ProtocolError");
}

#[test]
fn extended_connect_is_taken_when_announced() {
    let mut c = Client::with(Config {
        connect_protocol: true,
        ..Config::default()
    });
    c.request(
        1,
        &[
            (":method", "CONNECT"),
            (":protocol", "websocket"),
            (":scheme", "https"),
            (":path", "/chat"),
            (":authority", "example.com"),
        ],
        false,
    );
    assert_eq!(c.take_events(), ["request 1 CONNECT /chat example.com"]);
}

#[test]
fn an_extended_connect_that_ended_its_stream_is_reset_as_malformed() {
    let mut c = Client::with(Config {
        connect_protocol: true,
        ..Config::default()
    });
    let connect = [
        (":method", "CONNECT"),
        (":protocol", "websocket"),
        (":scheme", "https"),
        (":path", "/chat"),
        (":authority", "example.com"),
    ];
    c.request(1, &connect, true);
    let frames = c.frames();
    let resets: Vec<_> = frames
        .iter()
        .filter(|(h, _)| h.kind == kind::RST_STREAM)
        .map(|(h, p)| (h.stream, u32::from_be_bytes(p[..4].try_into().unwrap())))
        .collect();
    assert_eq!(resets, [(1, u32::from(ErrorCode::ProtocolError))]);
    assert!(
        frames.iter().all(|(h, _)| h.kind != kind::GOAWAY),
        "a stream error, not the connection's"
    );
    assert!(!c.take_events().iter().any(|e| e.starts_with("request")));
    c.request(3, &connect, false);
    assert_eq!(c.take_events(), ["request 3 CONNECT /chat example.com"]);
}

#[test]
fn trailers_end_the_body() {
    let mut c = Client::new();
    let mut fields = GET.to_vec();
    fields[0] = (":method", "POST");
    c.request(1, &fields, false);
    let mut bytes = Vec::new();
    write::data(&mut bytes, 1, b"abc", false);
    let block = c.block(&[("grpc-status", "0")]);
    write::headers(&mut bytes, 1, &block, true);
    c.send(&bytes);
    assert_eq!(
        c.take_events(),
        ["request 1 POST / example.com", "data 1 3", "trailers 1 1"]
    );
    // Trailers without END_STREAM, or with a pseudo-field, are malformed.
    c.request(3, &fields, false);
    let block = c.block(&[("x", "1")]);
    let mut bytes = Vec::new();
    write::headers(&mut bytes, 3, &block, false);
    c.send(&bytes);
    assert_eq!(c.take_events()[1], "reset 3 ProtocolError");
    c.request(5, &fields, false);
    let block = c.block(&[(":path", "/x")]);
    let mut bytes = Vec::new();
    write::headers(&mut bytes, 5, &block, true);
    c.send(&bytes);
    assert_eq!(c.take_events()[1], "reset 5 ProtocolError");
}

/// Section 5.1: frames on idle streams end the connection; on streams the client
/// closed, they cost the stream.
#[test]
fn stream_states_are_kept() {
    for (what, bytes, code) in [
        (
            "DATA on idle",
            raw_frame(kind::DATA, 0, 1, b"x"),
            ErrorCode::ProtocolError,
        ),
        (
            "RST_STREAM on idle",
            raw_frame(kind::RST_STREAM, 0, 1, &[0, 0, 0, 8]),
            ErrorCode::ProtocolError,
        ),
        (
            "WINDOW_UPDATE on idle",
            raw_frame(kind::WINDOW_UPDATE, 0, 1, &[0, 0, 0, 1]),
            ErrorCode::ProtocolError,
        ),
        (
            "CONTINUATION on idle",
            raw_frame(kind::CONTINUATION, flags::END_HEADERS, 1, &[0x82]),
            ErrorCode::ProtocolError,
        ),
        (
            "even stream",
            raw_frame(kind::HEADERS, flags::END_HEADERS, 2, &[0x82]),
            ErrorCode::ProtocolError,
        ),
    ] {
        let mut c = Client::new();
        c.send(&bytes);
        assert_eq!(c.error.map(|e| e.code), Some(code), "{what}");
        assert_eq!(c.goaway(), Some(code), "{what}");
    }
    // Half-closed (remote): DATA is STREAM_CLOSED for the stream.
    let mut c = Client::new();
    c.get(1);
    c.send(&raw_frame(kind::DATA, 0, 1, b"x"));
    assert_eq!(c.resets(), [(1, ErrorCode::StreamClosed)]);
    assert!(c.error.is_none());
    // A stream id going backwards ends the connection with PROTOCOL_ERROR; HEADERS again
    // on a stream that was closed, with STREAM_CLOSED.
    let mut c = Client::new();
    c.get(5);
    c.get(3);
    assert_eq!(c.error.map(|e| e.code), Some(ErrorCode::ProtocolError));
    let mut c = Client::new();
    c.get(1);
    c.send(&raw_frame(kind::RST_STREAM, 0, 1, &[0, 0, 0, 8]));
    c.get(1);
    assert_eq!(c.error.map(|e| e.code), Some(ErrorCode::StreamClosed));
}

/// Section 6.9: what we send is bounded by the client's windows, stream and connection,
/// and a window the client opens is used.
#[test]
fn sending_follows_the_clients_windows() {
    let mut c = Client::new();
    let mut settings = Vec::new();
    write::settings(
        &mut settings,
        &[frame::Setting {
            id: setting::INITIAL_WINDOW_SIZE,
            value: 10,
        }],
    );
    c.send(&settings);
    c.get(1);
    c.frames();
    let mut out = Vec::new();
    c.conn
        .send_head(1, false, &mut out, |b| encoder::status(200, b));
    assert_eq!(c.conn.send_window(1), 10);
    assert_eq!(c.conn.send_data(1, &[7; 25], true, &mut out), 10);
    assert_eq!(
        c.conn.send_data(1, &[7; 15], true, &mut out),
        0,
        "window closed"
    );
    // The stream's window opens by 100 and then the connection's limits it: 65,535 less
    // the 10 sent.
    c.send(&raw_frame(kind::WINDOW_UPDATE, 0, 1, &100u32.to_be_bytes()));
    assert_eq!(c.take_events().last().unwrap(), "window");
    assert_eq!(c.conn.send_window(1), 100);
    // A SETTINGS change moves the open stream's window by the difference.
    let mut settings = Vec::new();
    write::settings(
        &mut settings,
        &[frame::Setting {
            id: setting::INITIAL_WINDOW_SIZE,
            value: 70_000,
        }],
    );
    c.send(&settings);
    assert_eq!(
        c.conn.send_window(1),
        65_525,
        "now the connection's window bounds it"
    );
    let sent = c.conn.send_data(1, &vec![1; 70_000], true, &mut out);
    assert_eq!(sent, 65_525);
    c.out = out;
    let data: Vec<usize> = c
        .frames()
        .iter()
        .filter(|(h, _)| h.kind == kind::DATA)
        .map(|(h, _)| h.len as usize)
        .collect();
    assert!(
        data.iter().all(|&n| n <= 16_384),
        "frames within MAX_FRAME_SIZE"
    );
    assert_eq!(data.iter().sum::<usize>(), 65_535);
    // Overflowing the connection's window is a connection error.
    c.send(&raw_frame(
        kind::WINDOW_UPDATE,
        0,
        0,
        &0x7fff_ffffu32.to_be_bytes(),
    ));
    c.send(&raw_frame(
        kind::WINDOW_UPDATE,
        0,
        0,
        &0x7fff_ffffu32.to_be_bytes(),
    ));
    assert_eq!(c.error.map(|e| e.code), Some(ErrorCode::FlowControlError));
}

/// What a client sends beyond the stream windows we announced is refused; what the
/// caller takes is given back in one WINDOW_UPDATE per half window.
#[test]
fn receiving_keeps_to_our_windows() {
    let mut c = Client::new();
    let mut fields = GET.to_vec();
    fields[0] = (":method", "POST");
    c.request(1, &fields, false);
    // A second upload's window opens the connection's beyond stream 1's: stream 1's
    // own window is what stops it below.
    c.request(3, &fields, false);
    let wanted = c.conn.connection_window_wanted();
    c.conn.open_connection_window(wanted, &mut Vec::new());
    c.frames();
    let chunk = vec![0u8; 16_384];
    for _ in 0..4 {
        let mut data = Vec::new();
        write::data(&mut data, 1, &chunk, false);
        c.send(&data);
    }
    assert!(c.resets().is_empty(), "64 KiB fits the window");
    let mut out = Vec::new();
    c.conn.release(1, 16_384, &mut out);
    assert!(out.is_empty(), "under half the window: nothing yet");
    c.conn.release(1, 16_384, &mut out);
    c.out = out;
    let updates: Vec<(u32, u32)> = c
        .frames()
        .iter()
        .filter(|(h, _)| h.kind == kind::WINDOW_UPDATE)
        .map(|(h, p)| (h.stream, u32::from_be_bytes(p[..4].try_into().unwrap())))
        .collect();
    assert_eq!(updates, [(1, 32_768)]);
    for _ in 0..3 {
        let mut data = Vec::new();
        write::data(&mut data, 1, &chunk, false);
        c.send(&data);
    }
    assert_eq!(
        c.resets(),
        [(1, ErrorCode::FlowControlError)],
        "past the window"
    );
}

/// The connection's window: opened only toward what the streams still receiving a
/// body can send (nothing while none is), so that no stream waits on another's bytes
/// the caller has not taken, never past the configured cap; the client may send no
/// more than it was opened to, and it opens again only by what the caller consumed and
/// reopens.
#[test]
fn the_connection_window_opens_toward_the_streams_receiving_bodies_and_no_further() {
    let mut out = Vec::new();
    let conn = Connection::new(Config::default(), &mut out);
    assert_eq!(conn.connection_allowance(), 65_535, "the protocol's window");
    assert_eq!(conn.connection_window_wanted(), 0, "no body is coming");
    let mut c = Client::new();
    c.request(1, &GET, true);
    assert_eq!(c.conn.connection_window_wanted(), 0, "a GET sends no body");
    let mut fields = GET.to_vec();
    fields[0] = (":method", "POST");
    let chunk = vec![0u8; 16_384];
    let fill = |c: &mut Client, id: u32| {
        c.request(id, &fields, false);
        let wanted = c.conn.connection_window_wanted();
        let mut out = Vec::new();
        c.conn.open_connection_window(wanted, &mut out);
        for _ in 0..4 {
            let mut data = Vec::new();
            write::data(&mut data, id, &chunk, false);
            c.send(&data);
        }
    };
    // Sixteen streams fill their 64 KiB windows, none taken by the caller.
    for s in 0..16u32 {
        fill(&mut c, 3 + 2 * s);
    }
    assert!(c.error.is_none(), "{:?}", c.error);
    assert_eq!(c.conn.connection_allowance(), 16 * 65_536, "all of it held");
    assert_eq!(c.conn.connection_window_wanted(), 0);
    // A seventeenth gets a window of its own: the others' unread bytes do not stall it.
    c.request(35, &fields, false);
    assert_eq!(c.conn.connection_window_wanted(), 65_536);
    // Once its body has ended nothing more is wanted for it.
    let mut data = Vec::new();
    write::data(&mut data, 35, b"", true);
    c.send(&data);
    assert_eq!(c.conn.connection_window_wanted(), 0);

    // Capped: at a 1 MiB connection window the seventeenth stream's byte is past it.
    let mut c = Client::with(Config {
        connection_window: 1 << 20,
        ..Config::default()
    });
    for s in 0..16u32 {
        fill(&mut c, 1 + 2 * s);
    }
    assert!(c.error.is_none(), "{:?}", c.error);
    c.request(33, &fields, false);
    assert_eq!(c.conn.connection_window_wanted(), 0, "the cap");
    c.frames();
    let mut data = Vec::new();
    write::data(&mut data, 33, b"x", false);
    c.send(&data);
    assert_eq!(c.error.map(|e| e.code), Some(ErrorCode::FlowControlError));

    // Consumed bytes are wanted back, and come back only when opened.
    let mut c = Client::new();
    c.request(1, &fields, false);
    assert_eq!(c.conn.connection_window_wanted(), 1, "the stream's 65,536");
    c.conn.open_connection_window(1, &mut Vec::new());
    let mut data = Vec::new();
    write::data(&mut data, 1, &chunk, false);
    c.send(&data);
    c.frames();
    assert_eq!(c.conn.connection_window_wanted(), 0, "held, not consumed");
    c.conn.consumed(16_384);
    // Back to the protocol's 65,535 (the stream's own window was not given back).
    assert_eq!(c.conn.connection_window_wanted(), 16_383);
    let mut out = Vec::new();
    c.conn.open_connection_window(16_383, &mut out);
    c.out = out;
    let updates: Vec<(u32, u32)> = c
        .frames()
        .iter()
        .filter(|(h, _)| h.kind == kind::WINDOW_UPDATE)
        .map(|(h, p)| (h.stream, u32::from_be_bytes(p[..4].try_into().unwrap())))
        .collect();
    assert_eq!(updates, [(0, 16_383)]);
    assert_eq!(c.conn.connection_window_wanted(), 0);
}

/// However much a caller asks to open, the connection's window never goes past 2^31-1
/// (a larger one is a FLOW_CONTROL_ERROR for the client, RFC 9113 section 6.9.1): a
/// miscount once sent 0xffff0404 past a GOAWAY.
#[test]
fn the_connection_window_is_never_opened_past_the_protocols_largest() {
    let mut c = Client::new();
    let mut out = Vec::new();
    c.conn.open_connection_window(u32::MAX, &mut out);
    c.conn.open_connection_window(1 << 20, &mut out);
    c.out = out;
    let opened: u64 = c
        .frames()
        .iter()
        .filter(|(h, _)| h.kind == kind::WINDOW_UPDATE && h.stream == 0)
        .map(|(_, p)| u64::from(u32::from_be_bytes(p[..4].try_into().unwrap())))
        .sum();
    assert_eq!(opened + 65_535, (1 << 31) - 1);
}

#[test]
fn streams_past_the_limit_are_refused() {
    let mut c = Client::with(Config {
        max_concurrent_streams: 2,
        ..Config::default()
    });
    c.request(1, &GET, false);
    c.request(3, &GET, false);
    c.request(5, &GET, false);
    assert_eq!(c.resets(), [(5, ErrorCode::RefusedStream)]);
    assert_eq!(c.take_events()[2], "refused 5 TooManyStreams");
    // The block was decoded all the same: the next request's indexed fields resolve.
    c.send(&raw_frame(kind::RST_STREAM, 0, 1, &[0, 0, 0, 8]));
    c.request(7, &GET, true);
    assert_eq!(
        c.take_events().last().unwrap(),
        "request 7 GET / example.com end"
    );
}

/// A request's fields over SETTINGS_MAX_HEADER_LIST_SIZE: 431 with the connection's
/// `Server` field, and the tables stay in step for the next request.
#[test]
fn an_oversized_request_is_answered_431() {
    let mut c = Client::with(Config {
        max_header_list_size: 1024,
        server: Some(hyper::header::HeaderValue::from_static("edge")),
        ..Config::default()
    });
    // Over 1,024 bytes but under twice that, which would end the connection.
    let big = "x".repeat(1500);
    let mut fields = GET.to_vec();
    fields.push(("cookie", &big));
    c.request(1, &fields, true);
    assert_eq!(c.take_events(), ["refused 1 TooLarge"]);
    let frames = c.frames();
    let fields = loona_hpack::Decoder::new().decode(&frames[0].1).unwrap();
    assert_eq!(fields[0], (b":status".to_vec(), b"431".to_vec()));
    assert_eq!(fields[1], (b"server".to_vec(), b"edge".to_vec()));
    c.request(3, &GET, true);
    assert_eq!(c.take_events(), ["request 3 GET / example.com end"]);
}

/// CVE-2023-44487: requests reset before their answers, past the glitch limit, end the
/// connection with ENHANCE_YOUR_CALM (and up to the limit, every one is seen as reset).
#[test]
fn rapid_reset_ends_the_connection() {
    let mut c = Client::with(Config {
        max_glitches: 100,
        ..Config::default()
    });
    let mut id = 1;
    while c.error.is_none() && id < 1000 {
        c.request(id, &GET, false);
        c.send(&raw_frame(kind::RST_STREAM, 0, id, &[0, 0, 0, 8]));
        id += 2;
    }
    assert_eq!(c.error.map(|e| e.code), Some(ErrorCode::EnhanceYourCalm));
    assert_eq!(id, 203, "after 101 resets");
    assert_eq!(c.goaway(), Some(ErrorCode::EnhanceYourCalm));
    assert!(c.conn.is_done());
}

/// Requests answered before the client resets them are no glitch: a client cancelling
/// what it no longer needs is served as long as it likes.
#[test]
fn resets_after_answers_are_not_counted() {
    let mut c = Client::with(Config {
        max_glitches: 10,
        ..Config::default()
    });
    for id in (1..200).step_by(2) {
        c.request(id, &GET, false);
        let mut out = Vec::new();
        c.conn
            .send_head(id, false, &mut out, |b| encoder::status(200, b));
        c.send(&raw_frame(kind::RST_STREAM, 0, id, &[0, 0, 0, 8]));
    }
    assert!(c.error.is_none());
}

#[test]
fn empty_frame_floods_end_the_connection() {
    for flood in [
        raw_frame(kind::DATA, 0, 1, b""),
        raw_frame(kind::CONTINUATION, 0, 1, b""),
    ] {
        let mut c = Client::with(Config {
            max_glitches: 50,
            ..Config::default()
        });
        if flood[3] == kind::CONTINUATION {
            let block = c.block(&GET);
            c.send(&raw_frame(kind::HEADERS, 0, 1, &block));
        } else {
            c.request(1, &GET, false);
        }
        for _ in 0..51 {
            c.send(&flood);
        }
        assert_eq!(c.error.map(|e| e.code), Some(ErrorCode::EnhanceYourCalm));
    }
}

/// CVE-2024-27316 and kin: a field block that never ends is bounded in bytes.
#[test]
fn a_continuation_flood_is_bounded() {
    let mut c = Client::new();
    c.send(&raw_frame(kind::HEADERS, 0, 1, &[0x82]));
    let piece = vec![0x82u8; 16_384];
    let mut frames = 0;
    while c.error.is_none() {
        c.send(&raw_frame(kind::CONTINUATION, 0, 1, &piece));
        frames += 1;
    }
    assert_eq!(c.error.map(|e| e.code), Some(ErrorCode::EnhanceYourCalm));
    assert!(frames <= 5, "{frames} frames of 16 KiB taken");
    assert!(c.conn.block.capacity() <= 128 << 10);
}

/// A block of one-byte references to a 4 KB table entry expands past the limit: the
/// decoder stops, the connection ends.
#[test]
fn an_hpack_bomb_ends_the_connection() {
    let mut c = Client::new();
    let big = "x".repeat(4000);
    let mut fields = GET.to_vec();
    fields.push(("bomb", &big));
    let mut block = c.block(&fields); // indexes "bomb" at 62
    block.extend(std::iter::repeat_n(0xbe, 3000));
    c.send(&raw_frame(
        kind::HEADERS,
        flags::END_STREAM | flags::END_HEADERS,
        1,
        &block,
    ));
    assert_eq!(c.error.map(|e| e.code), Some(ErrorCode::EnhanceYourCalm));
}

#[test]
fn settings_and_pings_are_answered() {
    let mut c = Client::new();
    c.send(&raw_frame(kind::PING, 0, 0, b"12345678"));
    let frames = c.frames();
    assert_eq!(frames.len(), 1);
    assert!(frames[0].0.has(flags::ACK));
    assert_eq!(frames[0].1, b"12345678");
    c.send(&raw_frame(kind::PING, flags::ACK, 0, b"12345678"));
    assert!(c.frames().is_empty(), "an answer is not answered");
    // A lowered HPACK table: our next block starts with a size update.
    let mut settings = Vec::new();
    write::settings(
        &mut settings,
        &[frame::Setting {
            id: setting::HEADER_TABLE_SIZE,
            value: 0,
        }],
    );
    c.send(&settings);
    c.get(1);
    c.frames();
    let mut out = Vec::new();
    c.conn
        .send_head(1, true, &mut out, |b| encoder::status(200, b));
    assert_eq!(&out[9..], [0x20, 0x88]);
}

#[test]
fn graceful_goaway_lets_open_streams_finish_and_ignores_new_ones() {
    let mut c = Client::new();
    c.get(1);
    let mut out = Vec::new();
    c.conn.go_away(&mut out);
    c.out = out;
    assert_eq!(c.goaway(), Some(ErrorCode::NoError));
    c.get(3);
    assert_eq!(c.take_events(), ["request 1 GET / example.com end"]);
    assert!(!c.conn.is_done(), "stream 1 is still open");
    let mut out = Vec::new();
    c.conn
        .send_head(1, true, &mut out, |b| encoder::status(200, b));
    assert!(c.conn.is_done());
}

#[test]
fn a_large_response_head_is_cut_into_continuations() {
    let mut c = Client::new();
    c.get(1);
    c.frames();
    let mut out = Vec::new();
    let big = vec![b'v'; 40_000];
    c.conn.send_head(1, true, &mut out, |b| {
        encoder::status(200, b);
        encoder::field(b"x-big", &big, b);
    });
    c.out = out;
    let frames = c.frames();
    let kinds: Vec<u8> = frames.iter().map(|(h, _)| h.kind).collect();
    assert_eq!(
        kinds,
        [kind::HEADERS, kind::CONTINUATION, kind::CONTINUATION]
    );
    assert!(frames[0].0.has(flags::END_STREAM) && !frames[0].0.has(flags::END_HEADERS));
    assert!(frames[2].0.has(flags::END_HEADERS));
    let block: Vec<u8> = frames.iter().flat_map(|(_, p)| p.clone()).collect();
    let fields = loona_hpack::Decoder::new().decode(&block).unwrap();
    assert_eq!(fields[1].1.len(), 40_000);
}

/// Section 5.1: frames in flight on a stream this end reset are dropped, not errors:
/// DATA (its window still counted) and trailers (its block still decoded).
#[test]
fn frames_after_our_reset_are_dropped_quietly() {
    let mut c = Client::with(Config {
        max_glitches: 10,
        ..Config::default()
    });
    let mut fields = GET.to_vec();
    fields[0] = (":method", "POST");
    c.request(1, &fields, false);
    let mut out = Vec::new();
    c.conn
        .send_head(1, true, &mut out, |b| encoder::status(200, b));
    c.conn.cancel(1, ErrorCode::NoError, &mut out);
    c.frames();
    let mut bytes = Vec::new();
    for _ in 0..100 {
        write::data(&mut bytes, 1, b"x", false);
    }
    let block = c.block(&[("x-trailer", "1")]);
    write::headers(&mut bytes, 1, &block, true);
    c.send(&bytes);
    assert!(c.error.is_none(), "{:?}", c.error);
    assert!(
        c.resets().is_empty(),
        "no RST_STREAM for what was in flight"
    );
    // The tables are in step: the next request's indexed fields resolve.
    c.request(3, &GET, true);
    assert_eq!(
        c.take_events().last().unwrap(),
        "request 3 GET / example.com end"
    );
}

/// The glitch limit grows with the streams answered: a client that cancels some of
/// many requests is served on.
#[test]
fn the_glitch_limit_grows_with_streams_answered() {
    let mut c = Client::with(Config {
        max_glitches: 5,
        ..Config::default()
    });
    let mut id = 1;
    for round in 0..50 {
        for _ in 0..4 {
            c.get(id);
            let mut out = Vec::new();
            c.conn
                .send_head(id, true, &mut out, |b| encoder::status(200, b));
            id += 2;
        }
        // One cancelled before its answer for every four answered.
        c.request(id, &GET, false);
        c.send(&raw_frame(kind::RST_STREAM, 0, id, &[0, 0, 0, 8]));
        id += 2;
        assert!(c.error.is_none(), "round {round}");
    }
}

#[test]
fn stream_errors_on_idle_streams_end_the_connection_and_goaway_names_the_last_request() {
    let mut c = Client::new();
    c.get(1);
    c.frames();
    // A zero WINDOW_UPDATE is a stream error, but stream 9 is idle.
    c.send(&raw_frame(kind::WINDOW_UPDATE, 0, 9, &[0, 0, 0, 0]));
    assert_eq!(c.error.map(|e| e.code), Some(ErrorCode::ProtocolError));
    let frames = c.frames();
    let (_, payload) = frames.iter().find(|(h, _)| h.kind == kind::GOAWAY).unwrap();
    assert_eq!(u32::from_be_bytes(payload[..4].try_into().unwrap()), 1);
}
