//! The frame layer's rules one by one, then cross-checked against the `h2` crate's frame
//! decoder (the reference implementation hyper uses) on random frames: both accept the
//! same frames and read the same fields from them.

use bytes::BytesMut;
use proptest::prelude::*;

use super::*;

fn head(len: usize, kind: u8, flags: u8, stream: u32) -> Head {
    Head {
        len: len as u32,
        kind,
        flags,
        stream,
    }
}

fn parse_one(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Result<Frame<'_>, FrameError> {
    parse(head(payload.len(), kind, flags, stream), payload)
}

fn connection_code(r: Result<Frame<'_>, FrameError>) -> ErrorCode {
    match r {
        Err(FrameError::Connection(code, _)) => code,
        other => panic!("expected a connection error, got {other:?}"),
    }
}

#[test]
fn a_header_round_trips_and_drops_the_reserved_bit() {
    let h = head(0x12_3456, kind::HEADERS, 0x25, 0x1234_5678);
    assert_eq!(Head::parse(&h.encode()), h);
    let mut bytes = h.encode();
    bytes[5] |= 0x80;
    assert_eq!(Head::parse(&bytes).stream, 0x1234_5678, "R bit ignored");
    assert_eq!(
        h.check_len(DEFAULT_MAX_FRAME_SIZE),
        Err(FrameError::Connection(
            ErrorCode::FrameSizeError,
            "a frame longer than SETTINGS_MAX_FRAME_SIZE"
        ))
    );
    assert!(head(16_384, 0, 0, 1)
        .check_len(DEFAULT_MAX_FRAME_SIZE)
        .is_ok());
}

#[test]
fn stream_frames_on_stream_0_and_connection_frames_on_a_stream_are_protocol_errors() {
    for k in [
        kind::DATA,
        kind::HEADERS,
        kind::PRIORITY,
        kind::RST_STREAM,
        kind::CONTINUATION,
    ] {
        let payload = [0u8; 5];
        let len = if k == kind::RST_STREAM { 4 } else { 5 };
        assert_eq!(
            connection_code(parse_one(k, 0, 0, &payload[..len])),
            ErrorCode::ProtocolError,
            "type {k}"
        );
    }
    assert_eq!(
        connection_code(parse_one(kind::SETTINGS, 0, 1, &[])),
        ErrorCode::ProtocolError
    );
    assert_eq!(
        connection_code(parse_one(kind::PING, 0, 1, &[0; 8])),
        ErrorCode::ProtocolError
    );
    assert_eq!(
        connection_code(parse_one(kind::GOAWAY, 0, 1, &[0; 8])),
        ErrorCode::ProtocolError
    );
}

#[test]
fn padding_is_removed_and_too_much_is_a_protocol_error() {
    let payload = [3, b'a', b'b', 0, 0, 0];
    match parse_one(kind::DATA, flags::PADDED | flags::END_STREAM, 1, &payload) {
        Ok(Frame::Data {
            data,
            flow_len,
            end_stream,
            ..
        }) => {
            assert_eq!(data, b"ab");
            assert_eq!(flow_len, 6, "padding counts against flow control");
            assert!(end_stream);
        }
        other => panic!("{other:?}"),
    }
    // Padding as long as the payload (pad length byte included), or longer.
    assert_eq!(
        connection_code(parse_one(kind::DATA, flags::PADDED, 1, &[5, 0, 0, 0, 0])),
        ErrorCode::ProtocolError
    );
    // The whole rest as padding is allowed: no data.
    assert!(matches!(
        parse_one(kind::DATA, flags::PADDED, 1, &[4, 0, 0, 0, 0]),
        Ok(Frame::Data { data: [], .. })
    ));
    assert_eq!(
        connection_code(parse_one(kind::DATA, flags::PADDED, 1, &[])),
        ErrorCode::FrameSizeError
    );
    // HEADERS: padding may not reach into the priority fields.
    let p = flags::PADDED | flags::PRIORITY;
    assert_eq!(
        connection_code(parse_one(kind::HEADERS, p, 1, &[1, 0, 0, 0, 3, 9])),
        ErrorCode::ProtocolError
    );
    assert_eq!(
        connection_code(parse_one(kind::HEADERS, flags::PRIORITY, 1, &[0, 0, 0, 3])),
        ErrorCode::FrameSizeError
    );
    match parse_one(
        kind::HEADERS,
        p | flags::END_HEADERS,
        1,
        &[1, 0x80, 0, 0, 3, 9, b'x', 0],
    ) {
        Ok(Frame::Headers {
            priority: Some(priority),
            fragment,
            end_headers: true,
            end_stream: false,
            ..
        }) => {
            assert_eq!(fragment, b"x");
            assert_eq!(
                priority,
                Priority {
                    depends_on: 3,
                    exclusive: true,
                    weight: 9
                }
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_stream_depending_on_itself_is_a_stream_error() {
    let own = [0, 0, 0, 7, 16];
    assert_eq!(
        parse_one(kind::PRIORITY, 0, 7, &own),
        Err(FrameError::Stream(
            7,
            ErrorCode::ProtocolError,
            "a stream that depends on itself"
        ))
    );
    assert!(matches!(
        parse_one(kind::HEADERS, flags::PRIORITY, 7, &own),
        Err(FrameError::Stream(7, ErrorCode::ProtocolError, _))
    ));
    assert_eq!(
        parse_one(kind::PRIORITY, 0, 7, &own[..4]).map_err(|e| e.code()),
        Err(ErrorCode::FrameSizeError),
        "a PRIORITY of another length: its stream's error"
    );
    assert!(matches!(
        parse_one(kind::PRIORITY, 0, 7, &[0; 6]),
        Err(FrameError::Stream(7, ErrorCode::FrameSizeError, _))
    ));
}

#[test]
fn fixed_size_frames_of_another_size_are_frame_size_errors() {
    for (k, stream, good) in [
        (kind::RST_STREAM, 1, 4),
        (kind::PING, 0, 8),
        (kind::WINDOW_UPDATE, 0, 4),
    ] {
        for len in [0, good - 1, good + 1] {
            assert_eq!(
                connection_code(parse_one(k, 0, stream, &vec![1; len])),
                ErrorCode::FrameSizeError,
                "type {k} of {len} bytes"
            );
        }
    }
    assert_eq!(
        connection_code(parse_one(kind::GOAWAY, 0, 0, &[0; 7])),
        ErrorCode::FrameSizeError
    );
}

#[test]
fn settings_are_checked_value_by_value() {
    let one = |id: u16, value: u32| {
        let mut v = id.to_be_bytes().to_vec();
        v.extend_from_slice(&value.to_be_bytes());
        v
    };
    let good = [
        one(setting::HEADER_TABLE_SIZE, 0),
        one(setting::ENABLE_PUSH, 1),
        one(setting::INITIAL_WINDOW_SIZE, MAX_WINDOW),
        one(setting::MAX_FRAME_SIZE, MAX_FRAME_SIZE_LIMIT),
        one(0x99, u32::MAX),
    ]
    .concat();
    match parse_one(kind::SETTINGS, 0, 0, &good) {
        Ok(Frame::Settings {
            ack: false,
            settings,
        }) => assert_eq!(settings.count(), 5, "unknown ones passed on to be ignored"),
        other => panic!("{other:?}"),
    }
    for (bad, code) in [
        (one(setting::ENABLE_PUSH, 2), ErrorCode::ProtocolError),
        (
            one(setting::ENABLE_CONNECT_PROTOCOL, 2),
            ErrorCode::ProtocolError,
        ),
        (
            one(setting::INITIAL_WINDOW_SIZE, MAX_WINDOW + 1),
            ErrorCode::FlowControlError,
        ),
        (
            one(setting::MAX_FRAME_SIZE, DEFAULT_MAX_FRAME_SIZE - 1),
            ErrorCode::ProtocolError,
        ),
        (
            one(setting::MAX_FRAME_SIZE, MAX_FRAME_SIZE_LIMIT + 1),
            ErrorCode::ProtocolError,
        ),
        (vec![0; 5], ErrorCode::FrameSizeError),
    ] {
        assert_eq!(
            connection_code(parse_one(kind::SETTINGS, 0, 0, &bad)),
            code,
            "{bad:?}"
        );
    }
    assert_eq!(
        connection_code(parse_one(kind::SETTINGS, flags::ACK, 0, &good)),
        ErrorCode::FrameSizeError,
        "an acknowledgement with parameters"
    );
}

#[test]
fn zero_window_updates_push_promises_and_unknown_types() {
    assert_eq!(
        connection_code(parse_one(kind::WINDOW_UPDATE, 0, 0, &[0x80, 0, 0, 0])),
        ErrorCode::ProtocolError,
        "0 on the connection (the reserved bit ignored)"
    );
    assert!(matches!(
        parse_one(kind::WINDOW_UPDATE, 0, 3, &[0, 0, 0, 0]),
        Err(FrameError::Stream(3, ErrorCode::ProtocolError, _))
    ));
    assert_eq!(
        connection_code(parse_one(
            kind::PUSH_PROMISE,
            flags::END_HEADERS,
            1,
            &[0; 4]
        )),
        ErrorCode::ProtocolError
    );
    assert_eq!(
        parse_one(0xfa, 0xff, 9, b"whatever"),
        Ok(Frame::Unknown {
            kind: 0xfa,
            stream: 9
        })
    );
}

#[test]
fn written_frames_parse_back() {
    let mut out = Vec::new();
    write::settings(
        &mut out,
        &[Setting {
            id: setting::MAX_CONCURRENT_STREAMS,
            value: 128,
        }],
    );
    write::settings_ack(&mut out);
    write::ping_ack(&mut out, *b"12345678");
    write::goaway(&mut out, 7, ErrorCode::EnhanceYourCalm, b"calm");
    write::rst_stream(&mut out, 5, ErrorCode::Cancel);
    write::window_update(&mut out, 0, MAX_WINDOW);
    write::data(&mut out, 3, b"body", true);
    write::headers(&mut out, 3, b"\x82", false);
    let mut frames = Vec::new();
    let mut rest = &out[..];
    while let Some((h, after)) = rest.split_first_chunk::<HEADER_LEN>() {
        let h = Head::parse(h);
        let (payload, after) = after.split_at(h.len as usize);
        frames.push(parse(h, payload).unwrap());
        rest = after;
    }
    assert_eq!(
        frames,
        vec![
            Frame::Settings {
                ack: false,
                settings: Settings(&[0, 3, 0, 0, 0, 128])
            },
            Frame::Settings {
                ack: true,
                settings: Settings(&[])
            },
            Frame::Ping {
                ack: true,
                data: *b"12345678"
            },
            Frame::GoAway {
                last_stream: 7,
                code: ErrorCode::EnhanceYourCalm,
                debug: b"calm"
            },
            Frame::RstStream {
                stream: 5,
                code: ErrorCode::Cancel
            },
            Frame::WindowUpdate {
                stream: 0,
                increment: MAX_WINDOW
            },
            Frame::Data {
                stream: 3,
                end_stream: true,
                data: b"body",
                flow_len: 4
            },
            Frame::Headers {
                stream: 3,
                end_stream: false,
                end_headers: true,
                priority: None,
                fragment: b"\x82"
            },
        ]
    );
}

#[test]
fn every_error_code_round_trips() {
    for code in 0..=0x20u32 {
        assert_eq!(u32::from(ErrorCode::from(code)), code);
    }
}

// ---- Cross-checked against the h2 crate ------------------------------------------------

fn h2_head(kind: u8, flags: u8, stream: u32) -> h2::frame::Head {
    let bytes = head(0, kind, flags, stream).encode();
    h2::frame::Head::parse(&bytes)
}

/// Payloads built to hit the edges: short, padded, mostly-valid settings.
fn payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..24),
        prop::collection::vec(prop_oneof![Just(0u8), Just(1), Just(5), any::<u8>()], 0..24),
    ]
}

/// SETTINGS payloads of known and unknown parameters with values around their limits.
fn settings_payload() -> impl Strategy<Value = Vec<u8>> {
    let id = prop_oneof![1u16..=6, Just(0x99u16)];
    let value = prop_oneof![
        Just(0u32),
        Just(1),
        Just(2),
        Just(DEFAULT_MAX_FRAME_SIZE - 1),
        Just(DEFAULT_MAX_FRAME_SIZE),
        Just(MAX_FRAME_SIZE_LIMIT),
        Just(MAX_FRAME_SIZE_LIMIT + 1),
        Just(MAX_WINDOW),
        Just(MAX_WINDOW + 1),
        any::<u32>(),
    ];
    prop::collection::vec((id, value), 0..5).prop_map(|list| {
        list.iter()
            .flat_map(|(id, v)| [&id.to_be_bytes()[..], &v.to_be_bytes()[..]].concat())
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn headers_agree_with_h2(flags in any::<u8>(), stream in 1u32..8, payload in payload()) {
        let ours = parse_one(kind::HEADERS, flags, stream, &payload);
        let theirs = h2::frame::Headers::load(
            h2_head(kind::HEADERS, flags, stream),
            BytesMut::from(&payload[..]),
        );
        match (&ours, &theirs) {
            (Ok(Frame::Headers { fragment, end_stream, end_headers, priority, .. }), Ok((h, block))) => {
                prop_assert_eq!(*fragment, &block[..]);
                prop_assert_eq!(*end_stream, h.is_end_stream());
                prop_assert_eq!(*end_headers, h.is_end_headers());
                prop_assert_eq!(priority.is_some(), flags & flags::PRIORITY != 0);
            }
            (Err(_), Err(_)) => {}
            _ => prop_assert!(false, "ours {:?}, h2's {:?}", ours, theirs.map(|_| ())),
        }
    }

    #[test]
    fn settings_agree_with_h2(ack in any::<bool>(), payload in prop_oneof![settings_payload(), payload()]) {
        let flags = if ack { flags::ACK } else { 0 };
        let ours = parse_one(kind::SETTINGS, flags, 0, &payload);
        let theirs = h2::frame::Settings::load(h2_head(kind::SETTINGS, flags, 0), &payload);
        match (&ours, &theirs) {
            (Ok(Frame::Settings { ack: a, settings }), Ok(s)) => {
                prop_assert_eq!(*a, s.is_ack());
                let last = |id| settings.clone().filter(|x| x.id == id).last().map(|x| x.value);
                prop_assert_eq!(last(setting::INITIAL_WINDOW_SIZE), s.initial_window_size());
                prop_assert_eq!(last(setting::MAX_FRAME_SIZE), s.max_frame_size());
                prop_assert_eq!(last(setting::MAX_CONCURRENT_STREAMS), s.max_concurrent_streams());
                prop_assert_eq!(last(setting::HEADER_TABLE_SIZE), s.header_table_size());
                prop_assert_eq!(last(setting::MAX_HEADER_LIST_SIZE), s.max_header_list_size());
            }
            (Err(_), Err(_)) => {}
            _ => prop_assert!(false, "ours {:?}, h2's {:?}", ours, theirs),
        }
    }

    #[test]
    fn fixed_frames_agree_with_h2(k in prop_oneof![Just(kind::PING), Just(kind::GOAWAY),
            Just(kind::RST_STREAM), Just(kind::WINDOW_UPDATE), Just(kind::PRIORITY)],
            flags in any::<u8>(), stream in 0u32..4, payload in payload()) {
        // h2 checks a frame's stream (zero or not) in its connection code, not in these
        // decoders: compare on streams of the right kind for the frame.
        let stream = match k {
            kind::PING | kind::GOAWAY => 0,
            kind::WINDOW_UPDATE => stream,
            _ => stream.max(1),
        };
        let h = h2_head(k, flags, stream);
        let ours = parse_one(k, flags, stream, &payload);
        let agree = match k {
            kind::PING => match (&ours, h2::frame::Ping::load(h, &payload)) {
                (Ok(Frame::Ping { ack, data }), Ok(p)) => *ack == p.is_ack() && data == p.payload(),
                (Err(_), Err(_)) => true,
                _ => false,
            },
            kind::GOAWAY => match (&ours, h2::frame::GoAway::load(h, &payload)) {
                (Ok(Frame::GoAway { last_stream, code, debug }), Ok(g)) => {
                    *last_stream == u32::from(g.last_stream_id())
                        && u32::from(*code) == u32::from(g.reason())
                        && *debug == &g.debug_data()[..]
                }
                (Err(_), Err(_)) => true,
                _ => false,
            },
            kind::RST_STREAM => match (&ours, h2::frame::Reset::load(h, &payload)) {
                (Ok(Frame::RstStream { code, .. }), Ok(r)) => u32::from(*code) == u32::from(r.reason()),
                (Err(_), Err(_)) => true,
                _ => false,
            },
            kind::WINDOW_UPDATE => match (&ours, h2::frame::WindowUpdate::load(h, &payload)) {
                (Ok(Frame::WindowUpdate { increment, .. }), Ok(w)) => *increment == w.size_increment(),
                (Err(_), Err(_)) => true,
                _ => false,
            },
            _ => matches!(
                (&ours, h2::frame::Priority::load(h, &payload)),
                (Ok(Frame::Priority { .. }), Ok(_)) | (Err(_), Err(_))
            ),
        };
        prop_assert!(agree, "type {}: ours {:?}", k, ours);
    }

    #[test]
    fn heads_agree_with_h2(bytes in any::<[u8; HEADER_LEN]>()) {
        let ours = Head::parse(&bytes);
        let theirs = h2::frame::Head::parse(&bytes);
        prop_assert_eq!(ours.flags, theirs.flag());
        prop_assert_eq!(ours.stream, u32::from(theirs.stream_id()));
        prop_assert_eq!(&ours.encode()[3..5], &bytes[3..5]);
        prop_assert_eq!(ours.len, u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]));
    }

    /// DATA has no public decoder in h2: its padding rule is checked against the RFC's
    /// arithmetic instead (the pad length byte and the padding within the payload).
    #[test]
    fn data_padding_follows_the_rfc(pad in any::<u8>(), len in 0usize..300) {
        let mut payload = vec![pad];
        payload.resize(len.max(1), 7);
        let ours = parse_one(kind::DATA, flags::PADDED, 1, &payload);
        if (pad as usize) < payload.len() {
            let data = payload.len() - 1 - pad as usize;
            let got = matches!(ours, Ok(Frame::Data { data: d, .. }) if d.len() == data);
            prop_assert!(got, "{:?}", ours);
        } else {
            prop_assert_eq!(ours.map_err(|e| e.code()), Err(ErrorCode::ProtocolError));
        }
    }
}
