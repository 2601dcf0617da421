//! The record layer cross-checked against rustls: what we seal its client reads, what its
//! client writes we open, for every suite in TLS 1.2 and 1.3; and what we must refuse.

use std::collections::HashSet;
use std::io::{IoSlice, Read, Write};

use rustls::client::ClientConnection;
use rustls::server::ServerConnectionData;
use rustls::{AlertDescription, ContentType, ProtocolVersion, SupportedCipherSuite};

use super::cipher::tests_support::record_nonces;
use super::testing::{all_suites, handshake, Handshaken};
use super::*;

type Layer = RecordLayer<ServerConnectionData>;

/// The server's layer, a forger sealing as the client would (the client's write key is
/// our read key), and an observer opening what we seal (our write key).
fn setup(h: Handshaken) -> (ClientConnection, Layer, RecordCipher, RecordCipher) {
    let v = match h.kernel.protocol_version() {
        ProtocolVersion::TLSv1_3 => Version::Tls13,
        _ => Version::Tls12,
    };
    let forger = RecordCipher::new(&h.secrets.rx.1, v).unwrap();
    let observer = RecordCipher::new(&h.secrets.tx.1, v).unwrap();
    let (client, layer) = h.layer();
    (client, layer, forger, observer)
}

/// Feeds `bytes` to the client; its plaintext, or its error.
fn client_reads(client: &mut ClientConnection, bytes: &[u8]) -> Result<Vec<u8>, rustls::Error> {
    let mut rest = bytes;
    let mut plain = Vec::new();
    while !rest.is_empty() {
        client.read_tls(&mut rest).unwrap();
        client.process_new_packets()?;
        // Read as it comes: rustls holds a bounded amount of plaintext.
        match client.reader().read_to_end(&mut plain) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
    }
    Ok(plain)
}

/// The records the client sends for `data`.
fn client_sends(client: &mut ClientConnection, data: &[u8]) -> Vec<u8> {
    client.writer().write_all(data).unwrap();
    client_flight(client)
}

fn client_flight(client: &mut ClientConnection) -> Vec<u8> {
    let mut out = Vec::new();
    while client.wants_write() {
        client.write_tls(&mut out).unwrap();
    }
    out
}

/// Opens every record in `bytes`: the application data, and whether close_notify came.
fn open_all(layer: &mut Layer, bytes: &[u8]) -> Result<(Vec<u8>, bool), RecordError> {
    let mut buf = bytes.to_vec();
    let (mut plain, mut closed, mut at) = (Vec::new(), false, 0);
    while at < buf.len() {
        let len = 5 + u16::from_be_bytes([buf[at + 3], buf[at + 4]]) as usize;
        let record = &mut buf[at..at + len];
        match layer.open_in_place(record)? {
            Opened::Data(range) => plain.extend_from_slice(&record[range]),
            Opened::Control => {}
            Opened::Closed => closed = true,
        }
        at += len;
    }
    Ok((plain, closed))
}

fn seal(layer: &mut Layer, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    layer
        .seal_vectored(&[IoSlice::new(data)], &mut out)
        .unwrap();
    out
}

/// A record of type `typ` holding `body`, sealed by the forger as record `seq`.
fn forge(forger: &mut RecordCipher, seq: u64, typ: ContentType, body: &[u8]) -> Vec<u8> {
    let (prefix, suffix) = (forger.prefix_len(), forger.suffix_len());
    let mut record = vec![0; prefix + body.len() + suffix];
    record[prefix..prefix + body.len()].copy_from_slice(body);
    forger.seal_unchecked(seq, typ, &mut record).unwrap();
    record
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn every_suite_both_ways() {
    for (suite, version) in all_suites() {
        let (mut client, mut layer) = handshake(suite, version).layer();
        let data = pattern(40_000);
        assert_eq!(
            client_reads(&mut client, &seal(&mut layer, &data)).unwrap(),
            data,
            "{suite:?}"
        );
        let flight = client_sends(&mut client, &data);
        assert_eq!(
            open_all(&mut layer, &flight).unwrap(),
            (data, false),
            "{suite:?}"
        );
    }
}

#[test]
fn zero_length_and_padded_records_open() {
    for (suite, version) in all_suites() {
        let (_client, mut layer, mut forger, _) = setup(handshake(suite, version));
        let seq = layer.rx_seq();
        let empty = forge(&mut forger, seq, ContentType::ApplicationData, &[]);
        assert_eq!(
            open_all(&mut layer, &empty).unwrap(),
            (vec![], false),
            "{suite:?}"
        );
        if layer.version() == Version::Tls13 {
            // data || type || padding, the padding filling the record.
            let mut inner = b"padded".to_vec();
            inner.push(ContentType::ApplicationData.into());
            inner.resize(MAX_PLAINTEXT + 1, 0);
            let padded = forge(
                &mut forger,
                seq + 1,
                ContentType::Unknown(0),
                &inner[..MAX_PLAINTEXT],
            );
            assert_eq!(open_all(&mut layer, &padded).unwrap().0, b"padded");
        }
    }
}

#[test]
fn client_key_update_is_followed_and_answered() {
    for (suite, version) in all_suites()
        .into_iter()
        .filter(|(_, v)| v.version == ProtocolVersion::TLSv1_3)
    {
        let (mut client, mut layer) = handshake(suite, version).layer();
        client.refresh_traffic_keys().unwrap();
        let flight = client_sends(&mut client, b"after the update");
        assert_eq!(
            open_all(&mut layer, &flight).unwrap().0,
            b"after the update"
        );
        let answer = layer.take_queued().expect("a KeyUpdate answer");
        assert_eq!(layer.tx_seq(), 0, "our write key moved on");
        assert_eq!(layer.rx_seq(), 1, "the client's record after its KeyUpdate");
        assert_eq!(client_reads(&mut client, &answer).unwrap(), b"");
        let data = pattern(20_000);
        assert_eq!(
            client_reads(&mut client, &seal(&mut layer, &data)).unwrap(),
            data
        );
        // Twice more, both ways.
        client.refresh_traffic_keys().unwrap();
        let flight = client_sends(&mut client, &data);
        assert_eq!(open_all(&mut layer, &flight).unwrap().0, data);
        let sealed = seal(&mut layer, b"again");
        assert_eq!(client_reads(&mut client, &sealed).unwrap(), b"again");
    }
}

#[test]
fn key_update_requests_while_silent_get_one_answer() {
    let (suite, version) = all_suites()[0];
    let (mut client, mut layer) = handshake(suite, version).layer();
    client.refresh_traffic_keys().unwrap();
    let first = client_flight(&mut client);
    client.refresh_traffic_keys().unwrap();
    let second = client_flight(&mut client);
    open_all(&mut layer, &first).unwrap();
    open_all(&mut layer, &second).unwrap();
    let answer = layer.take_queued().unwrap();
    assert_eq!(answer.len(), 5 + 5 + 17, "one KeyUpdate");
    client_reads(&mut client, &answer).unwrap();
    let sealed = seal(&mut layer, b"after");
    assert_eq!(client_reads(&mut client, &sealed).unwrap(), b"after");
}

#[test]
fn close_notify_both_ways() {
    for (suite, version) in all_suites() {
        let (mut client, mut layer, mut forger, _) = setup(handshake(suite, version));
        let seq = layer.rx_seq();
        client.send_close_notify();
        let flight = client_flight(&mut client);
        assert_eq!(open_all(&mut layer, &flight).unwrap(), (vec![], true));
        assert!(layer.close_notify_received());
        // Anything after it is not read.
        let late = forge(&mut forger, seq + 1, ContentType::ApplicationData, b"late");
        assert_eq!(open_all(&mut layer, &late), Err(RecordError::AfterClose));
        // We may still send, then close.
        let sealed = seal(&mut layer, b"bye");
        layer.seal_close_notify().unwrap();
        let mut bytes = sealed;
        bytes.extend(layer.take_queued().unwrap());
        assert_eq!(client_reads(&mut client, &bytes).unwrap(), b"bye");
        let mut buf = [0u8; 1];
        assert_eq!(
            client.reader().read(&mut buf).unwrap(),
            0,
            "{suite:?}: the client saw close_notify"
        );
        assert_eq!(layer.seal_close_notify(), Err(RecordError::Closed));
    }
}

/// Refuses `bytes`, checking the alert the client is sent, as rustls reads it.
fn assert_refused(
    client: &mut ClientConnection,
    layer: &mut Layer,
    bytes: &[u8],
    alert: AlertDescription,
) {
    match open_all(layer, bytes) {
        Err(RecordError::Refused { alert: a, .. }) => assert_eq!(a, alert),
        other => panic!("expected a refusal with {alert:?}, got {other:?}"),
    }
    let sent = layer.take_queued().expect("an alert for the client");
    assert_eq!(
        client_reads(client, &sent),
        Err(rustls::Error::AlertReceived(alert))
    );
    // Nothing more is opened or sealed.
    assert!(open_all(layer, bytes).is_err());
    assert_eq!(layer.seal_close_notify(), Err(RecordError::Closed));
}

#[test]
fn tampered_records_are_refused_with_bad_record_mac() {
    for (suite, version) in all_suites() {
        let (mut client, mut layer) = handshake(suite, version).layer();
        let mut flight = client_sends(&mut client, b"honest");
        let last = flight.len() - 1;
        flight[last] ^= 1;
        assert_refused(
            &mut client,
            &mut layer,
            &flight,
            AlertDescription::BadRecordMac,
        );
    }
}

#[test]
fn oversized_records_are_refused_with_record_overflow() {
    for (suite, version) in all_suites() {
        for len in [MAX_PLAINTEXT + 257, MAX_PLAINTEXT + 2049, 0xffff] {
            let (mut client, mut layer) = handshake(suite, version).layer();
            let [hi, lo] = (len as u16).to_be_bytes();
            let mut record = vec![23, 3, 3, hi, lo];
            record.resize(5 + len, 0);
            assert_refused(
                &mut client,
                &mut layer,
                &record,
                AlertDescription::RecordOverflow,
            );
        }
    }
}

#[test]
fn tls13_inner_plaintext_rules() {
    let forged: [(&[u8], AlertDescription); 2] = [
        (&[0, 0, 0], AlertDescription::UnexpectedMessage),
        (&[], AlertDescription::UnexpectedMessage),
    ];
    for (suite, version) in all_suites()
        .into_iter()
        .filter(|(_, v)| v.version == ProtocolVersion::TLSv1_3)
    {
        for (body, alert) in forged {
            let (mut client, mut layer, mut forger, _) = setup(handshake(suite, version));
            let record = forge(&mut forger, layer.rx_seq(), ContentType::Unknown(0), body);
            assert_refused(&mut client, &mut layer, &record, alert);
        }
        // An inner plaintext of 2^14 + 2 bytes: data, type, one byte of padding.
        let (mut client, mut layer, mut forger, _) = setup(handshake(suite, version));
        let mut inner = vec![b'A'; MAX_PLAINTEXT];
        inner.push(ContentType::ApplicationData.into());
        let record = forge(&mut forger, layer.rx_seq(), ContentType::Unknown(0), &inner);
        assert_refused(
            &mut client,
            &mut layer,
            &record,
            AlertDescription::RecordOverflow,
        );
    }
}

/// Handshake and other records the peer must not send after the handshake.
#[test]
fn unexpected_messages_are_refused() {
    let tls13: &[(ContentType, &[u8], AlertDescription)] = &[
        // KeyUpdate of unknown value, and of the wrong length.
        (
            ContentType::Handshake,
            &[24, 0, 0, 1, 2],
            AlertDescription::IllegalParameter,
        ),
        (
            ContentType::Handshake,
            &[24, 0, 0, 2, 0, 0],
            AlertDescription::DecodeError,
        ),
        (
            ContentType::Handshake,
            &[24, 0, 0, 0],
            AlertDescription::DecodeError,
        ),
        // Two KeyUpdates in one record.
        (
            ContentType::Handshake,
            &[24, 0, 0, 1, 0, 24, 0, 0, 1, 0],
            AlertDescription::UnexpectedMessage,
        ),
        // A client's NewSessionTicket, a Finished.
        (
            ContentType::Handshake,
            &[4, 0, 0, 1, 0],
            AlertDescription::UnexpectedMessage,
        ),
        (
            ContentType::Handshake,
            &[20, 0, 0, 0],
            AlertDescription::UnexpectedMessage,
        ),
        (
            ContentType::Handshake,
            &[],
            AlertDescription::UnexpectedMessage,
        ),
        // change_cipher_spec and heartbeat inside, an alert of 3 bytes, of level 3.
        (
            ContentType::ChangeCipherSpec,
            &[1],
            AlertDescription::UnexpectedMessage,
        ),
        (
            ContentType::Heartbeat,
            &[1],
            AlertDescription::UnexpectedMessage,
        ),
        (
            ContentType::Alert,
            &[2, 0, 0],
            AlertDescription::DecodeError,
        ),
        (
            ContentType::Alert,
            &[3, 0],
            AlertDescription::IllegalParameter,
        ),
    ];
    let tls12: &[(ContentType, &[u8], AlertDescription)] = &[
        (
            ContentType::Handshake,
            &[0, 0, 0, 0],
            AlertDescription::UnexpectedMessage,
        ),
        (
            ContentType::Handshake,
            &[24, 0, 0, 1, 1],
            AlertDescription::UnexpectedMessage,
        ),
        (ContentType::Alert, &[2], AlertDescription::DecodeError),
    ];
    for (suite, version) in all_suites() {
        let cases = if version.version == ProtocolVersion::TLSv1_3 {
            tls13
        } else {
            tls12
        };
        for &(typ, body, alert) in cases {
            let (mut client, mut layer, mut forger, _) = setup(handshake(suite, version));
            let record = forge(&mut forger, layer.rx_seq(), typ, body);
            assert_refused(&mut client, &mut layer, &record, alert);
        }
        // A change_cipher_spec record after the handshake, in plaintext.
        let (mut client, mut layer) = handshake(suite, version).layer();
        assert_refused(
            &mut client,
            &mut layer,
            &[20, 3, 3, 0, 1, 1],
            AlertDescription::UnexpectedMessage,
        );
    }
}

#[test]
fn a_key_update_split_across_records_is_reassembled() {
    let (suite, version) = all_suites()[0];
    let message = [24, 0, 0, 1, 1];
    for cut in 1..message.len() {
        let (mut client, mut layer, mut forger, _) = setup(handshake(suite, version));
        let seq = layer.rx_seq();
        let mut bytes = forge(&mut forger, seq, ContentType::Handshake, &message[..cut]);
        bytes.extend(forge(
            &mut forger,
            seq + 1,
            ContentType::Handshake,
            &message[cut..],
        ));
        assert_eq!(open_all(&mut layer, &bytes).unwrap(), (vec![], false));
        let answer = layer.take_queued().expect("answered");
        assert_eq!(client_reads(&mut client, &answer).unwrap(), b"");
        // Application data between the pieces is refused.
        let (mut client, mut layer, mut forger, _) = setup(handshake(suite, version));
        let mut bytes = forge(&mut forger, seq, ContentType::Handshake, &message[..cut]);
        bytes.extend(forge(
            &mut forger,
            seq + 1,
            ContentType::ApplicationData,
            b"GET",
        ));
        assert_refused(
            &mut client,
            &mut layer,
            &bytes,
            AlertDescription::UnexpectedMessage,
        );
    }
}

#[test]
fn too_many_key_updates_in_a_row_are_refused() {
    let (suite, version) = all_suites()[0];
    let (mut client, mut layer) = handshake(suite, version).layer();
    for _ in 0..32 {
        client.refresh_traffic_keys().unwrap();
        let flight = client_flight(&mut client);
        open_all(&mut layer, &flight).unwrap();
    }
    client.refresh_traffic_keys().unwrap();
    let flight = client_flight(&mut client);
    let answers = layer.take_queued().unwrap();
    client_reads(&mut client, &answers).unwrap();
    assert_refused(
        &mut client,
        &mut layer,
        &flight,
        AlertDescription::UnexpectedMessage,
    );
}

#[test]
fn tls12_renegotiation_is_answered_with_a_warning_once() {
    for (suite, version) in all_suites()
        .into_iter()
        .filter(|(_, v)| v.version == ProtocolVersion::TLSv1_2)
    {
        let (mut client, mut layer, mut forger, observer) = setup(handshake(suite, version));
        let hello = [1, 0, 0, 6, 3, 3, 0, 0, 0, 0];
        let seq = layer.rx_seq();
        // Split across two records: the warning once, the message skipped.
        let mut bytes = forge(&mut forger, seq, ContentType::Handshake, &hello[..6]);
        bytes.extend(forge(
            &mut forger,
            seq + 1,
            ContentType::Handshake,
            &hello[6..],
        ));
        assert_eq!(open_all(&mut layer, &bytes).unwrap(), (vec![], false));
        let mut bytes = layer.take_queued().unwrap();
        let mut warning = bytes.clone();
        let (typ, range) = observer.open(layer.tx_seq() - 1, &mut warning).unwrap();
        assert_eq!((typ, &warning[range]), (ContentType::Alert, &[1, 100][..]));
        // The connection goes on: rustls's client ignores the warning.
        bytes.extend(seal(&mut layer, b"still here"));
        assert_eq!(client_reads(&mut client, &bytes).unwrap(), b"still here");
        let more = forge(&mut forger, seq + 2, ContentType::ApplicationData, b"more");
        assert_eq!(open_all(&mut layer, &more).unwrap().0, b"more");
        // A second try is refused.
        let second = forge(&mut forger, seq + 3, ContentType::Handshake, &hello);
        assert_refused(
            &mut client,
            &mut layer,
            &second,
            AlertDescription::UnexpectedMessage,
        );
    }
}

#[test]
fn tls13_forces_a_key_update_before_the_limit() {
    for (suite, version) in all_suites()
        .into_iter()
        .filter(|(_, v)| v.version == ProtocolVersion::TLSv1_3)
    {
        let (mut client, layer) = handshake(suite, version).layer();
        let mut layer = layer.with_key_limit(5);
        let data = pattern(3 * MAX_PLAINTEXT + 10);
        let mut sent = Vec::new();
        for _ in 0..10 {
            let sealed = seal(&mut layer, &data);
            assert!(layer.tx_seq() < 5, "never past the limit");
            sent.extend(client_reads(&mut client, &sealed).unwrap());
        }
        assert_eq!(
            sent,
            data.repeat(10),
            "{suite:?}: the client followed every KeyUpdate"
        );
    }
}

#[test]
fn tls12_refuses_to_seal_at_the_limit_but_still_closes() {
    for (suite, version) in all_suites()
        .into_iter()
        .filter(|(_, v)| v.version == ProtocolVersion::TLSv1_2)
    {
        let (mut client, layer) = handshake(suite, version).layer();
        let start = layer.tx_seq();
        let mut layer = layer.with_key_limit(start + 3);
        let mut bytes = seal(&mut layer, b"one");
        bytes.extend(seal(&mut layer, b"two"));
        let mut out = Vec::new();
        let third = layer.seal_vectored(&[IoSlice::new(b"three")], &mut out);
        assert_eq!(third, Err(RecordError::KeysExhausted));
        layer.seal_close_notify().unwrap();
        bytes.extend(layer.take_queued().unwrap());
        assert_eq!(client_reads(&mut client, &bytes).unwrap(), b"onetwo");
        assert_eq!(client.reader().read(&mut [0u8; 1]).unwrap(), 0);
    }
}

/// The suites whose key may seal 2^64 - 1 records (rustls's confidentiality limit for
/// ChaCha20-Poly1305), where the end of the sequence space, not the limit, comes first.
fn unlimited_suites() -> Vec<(
    SupportedCipherSuite,
    &'static rustls::SupportedProtocolVersion,
)> {
    all_suites()
        .into_iter()
        .filter(|(s, _)| {
            let limit = match s {
                SupportedCipherSuite::Tls13(s) => s.common.confidentiality_limit,
                SupportedCipherSuite::Tls12(s) => s.common.confidentiality_limit,
            };
            limit == u64::MAX
        })
        .collect()
}

/// Near 2^64 records under one key, TLS 1.3 changes its key before the sequence number
/// would wrap: the record that takes the last number short of 2^64 - 1 is the KeyUpdate,
/// and the next record is number 0 under the new key. The observer opens each record at
/// the sequence number it must have had.
#[test]
fn tls13_near_2_64_records_forces_a_key_update() {
    let suites: Vec<_> = unlimited_suites()
        .into_iter()
        .filter(|(_, v)| v.version == ProtocolVersion::TLSv1_3)
        .collect();
    assert!(!suites.is_empty(), "a TLS 1.3 suite without a record limit");
    for (suite, version) in suites {
        let (_client, mut layer, _forger, observer) = setup(handshake(suite, version));
        let start = u64::MAX - 4;
        layer.jump_sequences_for_tests(start, 0);
        let mut sealed = Vec::new();
        for word in [&b"one"[..], b"two", b"three", b"four"] {
            sealed.extend(seal(&mut layer, word));
        }
        let mut records = Vec::new();
        let mut at = 0;
        while at < sealed.len() {
            let len = 5 + u16::from_be_bytes([sealed[at + 3], sealed[at + 4]]) as usize;
            records.push(sealed[at..at + len].to_vec());
            at += len;
        }
        let open = |seq: u64, record: &[u8]| {
            let mut record = record.to_vec();
            let (typ, range) = observer.open(seq, &mut record).ok()?;
            Some((typ, record[range].to_vec()))
        };
        let data = |w: &[u8]| Some((ContentType::ApplicationData, w.to_vec()));
        assert_eq!(records.len(), 5, "{suite:?}: four records and a KeyUpdate");
        assert_eq!(open(start, &records[0]), data(b"one"));
        assert_eq!(open(start + 1, &records[1]), data(b"two"));
        assert_eq!(open(start + 2, &records[2]), data(b"three"));
        let (typ, body) = open(u64::MAX - 1, &records[3]).expect("the KeyUpdate, old key");
        assert_eq!((typ, body[0]), (ContentType::Handshake, 24), "{suite:?}");
        // "four" went under the new key, as its record 0: not under the old one at the
        // number that would have come next, nor at 0.
        assert_eq!(open(u64::MAX, &records[4]), None);
        assert_eq!(open(0, &records[4]), None);
        assert_eq!(
            layer.tx_seq(),
            1,
            "{suite:?}: the new key's count started at 0"
        );
    }
}

/// TLS 1.2 cannot change keys: near 2^64 it refuses application data and keeps the
/// last number short of 2^64 - 1 for close_notify; 2^64 - 1 itself is never used.
#[test]
fn tls12_near_2_64_records_refuses_data_and_closes() {
    let suites: Vec<_> = unlimited_suites()
        .into_iter()
        .filter(|(_, v)| v.version == ProtocolVersion::TLSv1_2)
        .collect();
    assert!(!suites.is_empty(), "a TLS 1.2 suite without a record limit");
    for (suite, version) in suites {
        let (_client, mut layer, _forger, observer) = setup(handshake(suite, version));
        let start = u64::MAX - 3;
        layer.jump_sequences_for_tests(start, 0);
        let mut one = seal(&mut layer, b"one");
        let mut two = seal(&mut layer, b"two");
        let mut out = Vec::new();
        assert_eq!(
            layer.seal_vectored(&[IoSlice::new(b"three")], &mut out),
            Err(RecordError::KeysExhausted),
            "{suite:?}: data refused at the last number"
        );
        layer.seal_close_notify().unwrap();
        let mut close = layer.take_queued().unwrap();
        let (typ, range) = observer.open(start, &mut one).unwrap();
        assert_eq!(
            (typ, &one[range]),
            (ContentType::ApplicationData, &b"one"[..])
        );
        let (typ, range) = observer.open(start + 1, &mut two).unwrap();
        assert_eq!(
            (typ, &two[range]),
            (ContentType::ApplicationData, &b"two"[..])
        );
        let (typ, range) = observer.open(u64::MAX - 1, &mut close).unwrap();
        assert_eq!((typ, &close[range]), (ContentType::Alert, &[1u8, 0][..]));
        assert_eq!(
            layer.tx_seq(),
            u64::MAX,
            "next would be 2^64 - 1, which nothing takes"
        );
        // Nothing at all is sealed as 2^64 - 1, not even close_notify.
        let (_client, mut layer, _forger, _observer) = setup(handshake(suite, version));
        layer.jump_sequences_for_tests(u64::MAX, 0);
        assert_eq!(layer.seal_close_notify(), Err(RecordError::KeysExhausted));
    }
}

/// The peer's records: the number before 2^64 - 1 opens, and a record that would take
/// 2^64 - 1 (after which the count would wrap) is refused with an alert, in both
/// versions: a peer must change keys (1.3) or close (1.2) before it.
#[test]
fn the_read_sequence_never_wraps() {
    for (suite, version) in all_suites() {
        let (mut client, mut layer, mut forger, _observer) = setup(handshake(suite, version));
        let start = u64::MAX - 1;
        layer.jump_sequences_for_tests(layer.tx_seq(), start);
        let last = forge(&mut forger, start, ContentType::ApplicationData, b"last");
        assert_eq!(open_all(&mut layer, &last).unwrap().0, b"last", "{suite:?}");
        let wrap = forge(&mut forger, u64::MAX, ContentType::ApplicationData, b"wrap");
        assert_refused(
            &mut client,
            &mut layer,
            &wrap,
            AlertDescription::InternalError,
        );
    }
}

/// No (key, nonce) pair repeats over 10^6 records, across forced KeyUpdates (TLS 1.3) or
/// under one key (TLS 1.2 AES-GCM, whose explicit nonces we check on the wire too); nor
/// does any meet a nonce rustls used under the same key for the handshake's records.
#[test]
fn nonces_never_repeat() {
    const RECORDS: u64 = 1_000_000;
    for (suite, version) in [all_suites()[0], all_suites()[3]] {
        let h = handshake(suite, version);
        let tls12 = version.version == ProtocolVersion::TLSv1_2;
        let v = if tls12 {
            Version::Tls12
        } else {
            Version::Tls13
        };
        let start = h.secrets.tx.0;
        let first = RecordCipher::new(&h.secrets.tx.1, v).unwrap();
        let mut seen: HashSet<([u8; 8], [u8; 12])> = (0..start)
            .map(|seq| (first.key_id_for_tests(), first.nonce(seq)))
            .collect();
        let (_client, layer) = h.layer();
        let mut layer = layer.with_key_limit(if tls12 { u64::MAX } else { 10_000 });
        let mut record = vec![0u8; layer.prefix_len() + 1 + layer.suffix_len()];
        let mut explicit = HashSet::new();
        let sealed = record_nonces(|| {
            for _ in 0..RECORDS {
                let seq = layer.tx_seq();
                layer.seal_in_place(&mut record).unwrap();
                drop(layer.take_queued());
                if tls12 {
                    // rustls's formula exactly: the last 8 bytes of iv XOR seq.
                    assert_eq!(record[5..13], first.nonce(seq)[4..]);
                    assert!(explicit.insert(<[u8; 8]>::try_from(&record[5..13]).unwrap()));
                }
            }
        });
        assert!(sealed.len() as u64 >= RECORDS);
        for pair in sealed {
            assert!(seen.insert(pair), "{suite:?}: a (key, nonce) pair repeated");
        }
    }
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    /// Cuts `bytes` at the given points (indices into it, any order).
    fn cut(bytes: &[u8], cuts: &[prop::sample::Index]) -> Vec<Vec<u8>> {
        let mut at: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
        at.push(0);
        at.push(bytes.len());
        at.sort_unstable();
        at.windows(2).map(|w| bytes[w[0]..w[1]].to_vec()).collect()
    }

    proptest! {
        // Each case shakes hands: a few dozen keep CI time predictable.
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Random writes sealed by us, the stream cut anywhere, read by rustls; and
        /// random writes by rustls, cut anywhere, reassembled and opened by us.
        #[test]
        fn round_trips_through_rustls(
            suite in 0..6usize,
            writes in prop::collection::vec(0..40_000usize, 1..5),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let (suite, version) = all_suites()[suite];
            let (mut client, mut layer) = handshake(suite, version).layer();
            let mut sealed = Vec::new();
            let mut expected = Vec::new();
            for (i, &n) in writes.iter().enumerate() {
                let data = vec![i as u8; n];
                layer.seal_vectored(&[IoSlice::new(&data[..n / 3]), IoSlice::new(&data[n / 3..])], &mut sealed).unwrap();
                expected.extend(data);
            }
            let mut read = Vec::new();
            for piece in cut(&sealed, &cuts) {
                read.extend(client_reads(&mut client, &piece).unwrap());
            }
            prop_assert_eq!(&read, &expected);

            let mut flight = Vec::new();
            for (i, &n) in writes.iter().enumerate() {
                flight.extend(client_sends(&mut client, &vec![i as u8 + 1; n]));
            }
            let mut pending = Vec::new();
            let mut opened = Vec::new();
            for piece in cut(&flight, &cuts) {
                pending.extend(piece);
                let whole = whole_records(&pending);
                let (plain, _) = open_all(&mut layer, &pending[..whole]).unwrap();
                opened.extend(plain);
                pending.drain(..whole);
            }
            let expected: Vec<u8> = writes.iter().enumerate().flat_map(|(i, &n)| vec![i as u8 + 1; n]).collect();
            prop_assert_eq!(opened, expected);
        }
    }
}
