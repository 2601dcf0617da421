//! The decoder against RFC 7541 Appendix C, its refusals one by one, and two independent
//! HPACK implementations: `loona-hpack` (Rust) under proptest, and Python's `hpack`
//! (python-hyper's, the `h2` package's), which indexes everything and Huffman-codes,
//! both ways. The encoder is tested here too, by what other decoders make of it.

use std::io::Write as _;
use std::process::{Command, Stdio};

use proptest::prelude::*;

use super::*;
use crate::h2::hpack::encoder;

type List = Vec<(Vec<u8>, Vec<u8>)>;

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode(decoder: &mut Decoder, block: &[u8]) -> Result<List, HpackError> {
    let mut list = Vec::new();
    let mut scratch = Vec::new();
    decoder.decode(block, 1 << 16, &mut scratch, |f| {
        list.push((f.name.to_vec(), f.value.to_vec()))
    })?;
    Ok(list)
}

fn list(fields: &[(&str, &str)]) -> List {
    fields
        .iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

fn table_of(decoder: &Decoder) -> List {
    (0..decoder.table().len())
        .map(|i| {
            let (n, v) = decoder.table().get(i).unwrap();
            (n.to_vec(), v.to_vec())
        })
        .collect()
}

const AUTHORITY: (&str, &str) = (":authority", "www.example.com");

/// Appendix C.3 (no Huffman) and C.4 (the same requests Huffman-coded): three blocks
/// on one connection, the table after each.
#[test]
fn the_rfc_request_examples() {
    for blocks in [
        [
            "828684410f7777772e6578616d706c652e636f6d",
            "828684be58086e6f2d6361636865",
            "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565",
        ],
        [
            "828684418cf1e3c2e5f23a6ba0ab90f4ff",
            "828684be5886a8eb10649cbf",
            "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf",
        ],
    ] {
        let mut d = Decoder::new(4096);
        let get = [(":method", "GET"), (":scheme", "http"), (":path", "/")];
        let mut first = get.to_vec();
        first.push(AUTHORITY);
        assert_eq!(decode(&mut d, &unhex(blocks[0])), Ok(list(&first)));
        assert_eq!(table_of(&d), list(&[AUTHORITY]));
        assert_eq!(d.table().size(), 57);
        let mut second = first.clone();
        second.push(("cache-control", "no-cache"));
        assert_eq!(decode(&mut d, &unhex(blocks[1])), Ok(list(&second)));
        assert_eq!(d.table().size(), 110);
        let third = [
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            AUTHORITY,
            ("custom-key", "custom-value"),
        ];
        assert_eq!(decode(&mut d, &unhex(blocks[2])), Ok(list(&third)));
        assert_eq!(
            table_of(&d),
            list(&[
                ("custom-key", "custom-value"),
                ("cache-control", "no-cache"),
                AUTHORITY
            ])
        );
        assert_eq!(d.table().size(), 164);
    }
}

/// Appendix C.5: responses through a 256-byte table, which evicts.
#[test]
fn the_rfc_response_examples_evict() {
    let mut d = Decoder::new(256);
    let date = "Mon, 21 Oct 2013 20:13:21 GMT";
    let location = "https://www.example.com";
    let first = unhex(
        "4803333032580770726976617465611d4d6f6e2c203231204f637420323031332032303a31333a3231\
         20474d546e1768747470733a2f2f7777772e6578616d706c652e636f6d",
    );
    let fields = [
        (":status", "302"),
        ("cache-control", "private"),
        ("date", date),
        ("location", location),
    ];
    assert_eq!(decode(&mut d, &first), Ok(list(&fields)));
    assert_eq!(d.table().size(), 222);
    let second = unhex("4803333037c1c0bf");
    let fields = [
        (":status", "307"),
        ("cache-control", "private"),
        ("date", date),
        ("location", location),
    ];
    assert_eq!(decode(&mut d, &second), Ok(list(&fields)));
    assert_eq!(
        table_of(&d),
        list(&[
            (":status", "307"),
            ("location", location),
            ("date", date),
            ("cache-control", "private")
        ]),
        ":status 302 evicted"
    );
    let third = unhex(
        "88c1611d4d6f6e2c203231204f637420323031332032303a31333a323220474d54c05a04677a69707738\
         666f6f3d4153444a4b48514b425a584f5157454f50495541585157454f49553b206d61782d616765\
         3d333630303b2076657273696f6e3d31",
    );
    let cookie = "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1";
    let fields = [
        (":status", "200"),
        ("cache-control", "private"),
        ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
        ("location", location),
        ("content-encoding", "gzip"),
        ("set-cookie", cookie),
    ];
    assert_eq!(decode(&mut d, &third), Ok(list(&fields)));
    assert_eq!(
        table_of(&d),
        list(&[
            ("set-cookie", cookie),
            ("content-encoding", "gzip"),
            ("date", "Mon, 21 Oct 2013 20:13:22 GMT")
        ])
    );
    assert_eq!(d.table().size(), 215);
}

#[test]
fn bad_blocks_are_refused() {
    let cases: [(&str, HpackError); 9] = [
        ("80", HpackError::InvalidIndex),
        ("be", HpackError::InvalidIndex), // 62 with an empty table
        ("ff00", HpackError::InvalidIndex),
        ("4003616263", HpackError::Truncated), // value missing
        ("40036162", HpackError::Truncated),   // name cut short
        ("0f", HpackError::Truncated),         // name index cut short
        ("823f", HpackError::Truncated),       // size update cut short
        ("823f00", HpackError::LateSizeUpdate),
        ("3fe21f", HpackError::SizeUpdateTooLarge), // 4097
    ];
    for (block, error) in cases {
        assert_eq!(
            decode(&mut Decoder::new(4096), &unhex(block)),
            Err(error),
            "{block}"
        );
    }
    // Huffman with a padding of zeros ("a" is 00011, then 000).
    assert_eq!(
        decode(&mut Decoder::new(4096), &unhex("0001618118")),
        Err(HpackError::Huffman)
    );
    // Two size updates at the start are fine (section 4.2), and 4096 is.
    let mut d = Decoder::new(4096);
    assert_eq!(
        decode(&mut d, &unhex("203fe11f82")),
        Ok(list(&[(":method", "GET")]))
    );
    assert_eq!(d.table().max_size(), 4096);
}

/// Past the caller's limit the fields stop coming but the table still follows the
/// block; far past it, the block is refused.
#[test]
fn an_oversized_list_is_decoded_but_not_handed_over() {
    let mut d = Decoder::new(4096);
    // Two fields with incremental indexing, 36 + 36 bytes as counted.
    let mut block = Vec::new();
    for name in [&b"aaaa"[..], b"bbbb"] {
        block.push(0x40);
        encoder::string(name, &mut block);
        encoder::string(b"", &mut block);
    }
    let mut seen = Vec::new();
    let mut scratch = Vec::new();
    let outcome = d.decode(&block, 50, &mut scratch, |f| seen.push(f.name.to_vec()));
    assert_eq!(outcome, Ok(Decoded::Oversized));
    assert_eq!(seen, [b"aaaa".to_vec()]);
    assert_eq!(table_of(&d), list(&[("bbbb", ""), ("aaaa", "")]));
    // One byte referencing a 4 KB entry, many times: refused once past twice the limit.
    let mut d = Decoder::new(4096);
    let mut block = vec![0x40];
    encoder::string(b"big", &mut block);
    encoder::string(&[b'x'; 4000], &mut block);
    block.extend(std::iter::repeat_n(0xbe, 100));
    let outcome = d.decode(&block, 16_384, &mut scratch, |_| {});
    assert_eq!(outcome, Err(HpackError::TooLarge));
}

#[test]
fn the_encoder_writes_the_static_status_codes_and_owes_a_size_update() {
    let mut out = Vec::new();
    encoder::status(200, &mut out);
    encoder::status(404, &mut out);
    encoder::status(302, &mut out);
    encoder::status(503, &mut out);
    let fields = decode(&mut Decoder::new(4096), &out).unwrap();
    let status = |v| (b":status".to_vec(), Vec::from(v));
    assert_eq!(
        fields,
        [status("200"), status("404"), status("302"), status("503")]
    );
    assert_eq!(&out[..2], [0x88, 0x8d]);
    let mut e = encoder::Encoder::default();
    let mut out = Vec::new();
    e.begin_block(&mut out);
    assert!(out.is_empty());
    e.peer_table_size(8192);
    e.begin_block(&mut out);
    assert!(out.is_empty(), "a larger table needs no word");
    e.peer_table_size(0);
    e.begin_block(&mut out);
    assert_eq!(out, [0x20]);
    e.begin_block(&mut out);
    assert_eq!(out, [0x20], "once");
}

/// Field names as HTTP/2 allows them (lower-case tokens) and some from the static
/// table, values of any byte but NUL, CR and LF.
fn field() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    let name = prop_oneof![
        proptest::sample::select(
            crate::h2::hpack::table::STATIC
                .iter()
                .map(|(n, _)| n.to_vec())
                .collect::<Vec<_>>()
        ),
        "[a-z0-9!#$%&'*+.^_`|~-]{1,20}".prop_map(String::into_bytes),
    ];
    let value = proptest::collection::vec(
        any::<u8>().prop_filter("no NUL, CR, LF", |b| !matches!(b, 0 | b'\r' | b'\n')),
        0..60,
    );
    (name, value)
}

fn lists() -> impl Strategy<Value = Vec<List>> {
    proptest::collection::vec(proptest::collection::vec(field(), 0..12), 1..8)
}

proptest! {
    /// loona-hpack's encoder (literals with indexing, indexed fields) into ours, block
    /// after block on one connection.
    #[test]
    fn loona_hpacks_blocks_decode_the_same(blocks in lists()) {
        let mut theirs = loona_hpack::Encoder::new();
        let mut ours = Decoder::new(4096);
        for fields in blocks {
            let block = theirs.encode(fields.iter().map(|(n, v)| (&n[..], &v[..])));
            prop_assert_eq!(decode(&mut ours, &block), Ok(fields));
        }
    }

    /// Our encoder's blocks (Huffman where shorter, names by static index) through
    /// loona-hpack's decoder.
    #[test]
    fn our_blocks_decode_the_same_in_loona_hpack(blocks in lists()) {
        let mut theirs = loona_hpack::Decoder::new();
        let mut e = encoder::Encoder::default();
        for fields in blocks {
            let mut block = Vec::new();
            e.begin_block(&mut block);
            for (n, v) in &fields {
                encoder::field(n, v, &mut block);
            }
            prop_assert_eq!(theirs.decode(&block).unwrap(), fields);
        }
    }

    /// Blocks cut short anywhere are refused, never misread or a panic.
    #[test]
    fn a_cut_block_is_refused_or_decodes_a_prefix(fields in proptest::collection::vec(field(), 1..8), cut in any::<prop::sample::Index>()) {
        let mut block = Vec::new();
        for (n, v) in &fields {
            encoder::field(n, v, &mut block);
        }
        let cut = cut.index(block.len());
        match decode(&mut Decoder::new(4096), &block[..cut]) {
            Ok(got) => prop_assert_eq!(&got[..], &fields[..got.len()]),
            Err(e) => prop_assert_eq!(e, HpackError::Truncated),
        }
    }

    /// Any bytes at all: an answer, never a panic or a table over its size.
    #[test]
    fn arbitrary_blocks_never_panic(blocks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..6)) {
        let mut d = Decoder::new(4096);
        for block in blocks {
            let _ = decode(&mut d, &block);
            prop_assert!(d.table().size() <= d.table().max_size());
        }
    }
}

/// Python's `hpack` both ways, on one connection each: its encoder (which indexes every
/// field, Huffman-codes, and here shrinks its table to 256 bytes so entries are evicted)
/// into our decoder, and our encoder into its decoder. Lists are a fixed pseudo-random
/// sequence so a failure repeats.
#[test]
fn python_hpack_agrees_both_ways() {
    let script = r#"
import sys, hpack
enc = hpack.Encoder()
enc.header_table_size = 256
dec = hpack.Decoder()
for line in sys.stdin:
    kind, rest = line.split(" ", 1)
    if kind == "enc":
        fields = [tuple(bytes.fromhex(x) for x in f.split(":")) for f in rest.split()]
        print(enc.encode(fields, huffman=True).hex(), flush=True)
    else:
        fields = dec.decode(bytes.fromhex(rest.strip()), raw=True)
        print(" ".join(n.hex() + ":" + v.hex() for n, v in fields), flush=True)
"#;
    let child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn();
    let found = Command::new("python3")
        .args(["-c", "import hpack"])
        .status()
        .is_ok_and(|s| s.success());
    if !terminus_testkit::runs_here(
        terminus_testkit::Need::PythonPackages,
        found,
        "no Python `hpack` package (pip install h2)",
    ) {
        return;
    }
    let mut child = child.unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let names: Vec<Vec<u8>> = crate::h2::hpack::table::STATIC
        .iter()
        .map(|(n, _)| n.to_vec())
        .chain((0..20).map(|i| format!("x-custom-{i}").into_bytes()))
        .collect();
    let mut ours = Decoder::new(4096);
    let mut e = encoder::Encoder::default();
    for round in 0..300 {
        let fields: List = (0..next(10))
            .map(|_| {
                let name = names[next(names.len() as u64) as usize].clone();
                // Values repeat often enough for the table to be used.
                let value: Vec<u8> = if next(2) == 0 {
                    format!("v{}", next(8)).into_bytes()
                } else {
                    (0..next(40))
                        .map(|_| (next(255) + 1) as u8)
                        .filter(|b| !matches!(b, b'\r' | b'\n'))
                        .collect()
                };
                (name, value)
            })
            .collect();
        let line: Vec<String> = fields
            .iter()
            .map(|(n, v)| format!("{}:{}", hex(n), hex(v)))
            .collect();
        writeln!(stdin, "enc {}", line.join(" ")).unwrap();
        let block = unhex(&lines.next().unwrap().unwrap());
        assert_eq!(
            decode(&mut ours, &block),
            Ok(fields.clone()),
            "round {round}: theirs into ours"
        );
        let mut block = Vec::new();
        e.begin_block(&mut block);
        for (n, v) in &fields {
            encoder::field(n, v, &mut block);
        }
        writeln!(stdin, "dec {}", hex(&block)).unwrap();
        let theirs = lines.next().unwrap().unwrap();
        assert_eq!(theirs, line.join(" "), "round {round}: ours into theirs");
    }
    assert!(ours.table().size() <= 256, "their size update took effect");
    assert!(!ours.table().is_empty());
    drop(stdin);
    child.wait().unwrap();
}

#[test]
fn plain_fields_decode_the_same_in_loona_hpack() {
    let mut block = Vec::new();
    encoder::field_plain(b"date", b"Fri, 27 Nov 2026 23:14:14 GMT", &mut block);
    encoder::field_plain(b"x-custom", b"value", &mut block);
    let fields = loona_hpack::Decoder::new().decode(&block).unwrap();
    assert_eq!(
        fields,
        [
            (b"date".to_vec(), b"Fri, 27 Nov 2026 23:14:14 GMT".to_vec()),
            (b"x-custom".to_vec(), b"value".to_vec())
        ]
    );
    assert_eq!(
        block[..2],
        [0x0f, 33 - 15],
        "date by static index 33, no indexing"
    );
}
