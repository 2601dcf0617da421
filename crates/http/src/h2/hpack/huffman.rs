//! HPACK's Huffman code (RFC 7541 section 5.2 and Appendix B), a fixed code built from
//! header statistics: most header bytes take 5 to 8 bits, so browsers send nearly every
//! string Huffman-coded and a server decodes it on every request.
//!
//! Only the 257 codes of Appendix B are written out below; the decoder's tables are
//! derived from them by `const fn`s at compile time, which also check that they form a
//! complete prefix code, so a mistyped code fails the build rather than a request.

use super::HpackError;

/// Appendix B, symbol by symbol: each code right-aligned, then its length in bits.
/// Symbol 256 is EOS, 30 ones, whose prefixes pad a string's last byte.
const CODES: [(u32, u8); 257] = [
    (0x1ff8, 13),     //   0
    (0x7fffd8, 23),   //   1
    (0xfffffe2, 28),  //   2
    (0xfffffe3, 28),  //   3
    (0xfffffe4, 28),  //   4
    (0xfffffe5, 28),  //   5
    (0xfffffe6, 28),  //   6
    (0xfffffe7, 28),  //   7
    (0xfffffe8, 28),  //   8
    (0xffffea, 24),   //   9
    (0x3ffffffc, 30), //  10
    (0xfffffe9, 28),  //  11
    (0xfffffea, 28),  //  12
    (0x3ffffffd, 30), //  13
    (0xfffffeb, 28),  //  14
    (0xfffffec, 28),  //  15
    (0xfffffed, 28),  //  16
    (0xfffffee, 28),  //  17
    (0xfffffef, 28),  //  18
    (0xffffff0, 28),  //  19
    (0xffffff1, 28),  //  20
    (0xffffff2, 28),  //  21
    (0x3ffffffe, 30), //  22
    (0xffffff3, 28),  //  23
    (0xffffff4, 28),  //  24
    (0xffffff5, 28),  //  25
    (0xffffff6, 28),  //  26
    (0xffffff7, 28),  //  27
    (0xffffff8, 28),  //  28
    (0xffffff9, 28),  //  29
    (0xffffffa, 28),  //  30
    (0xffffffb, 28),  //  31
    (0x14, 6),        //  32
    (0x3f8, 10),      //  33 '!'
    (0x3f9, 10),      //  34 '"'
    (0xffa, 12),      //  35 '#'
    (0x1ff9, 13),     //  36 '$'
    (0x15, 6),        //  37 '%'
    (0xf8, 8),        //  38 '&'
    (0x7fa, 11),      //  39 "'"
    (0x3fa, 10),      //  40 '('
    (0x3fb, 10),      //  41 ')'
    (0xf9, 8),        //  42 '*'
    (0x7fb, 11),      //  43 '+'
    (0xfa, 8),        //  44 ','
    (0x16, 6),        //  45 '-'
    (0x17, 6),        //  46 '.'
    (0x18, 6),        //  47 '/'
    (0x0, 5),         //  48 '0'
    (0x1, 5),         //  49 '1'
    (0x2, 5),         //  50 '2'
    (0x19, 6),        //  51 '3'
    (0x1a, 6),        //  52 '4'
    (0x1b, 6),        //  53 '5'
    (0x1c, 6),        //  54 '6'
    (0x1d, 6),        //  55 '7'
    (0x1e, 6),        //  56 '8'
    (0x1f, 6),        //  57 '9'
    (0x5c, 7),        //  58 ':'
    (0xfb, 8),        //  59 ';'
    (0x7ffc, 15),     //  60 '<'
    (0x20, 6),        //  61 '='
    (0xffb, 12),      //  62 '>'
    (0x3fc, 10),      //  63 '?'
    (0x1ffa, 13),     //  64 '@'
    (0x21, 6),        //  65 'A'
    (0x5d, 7),        //  66 'B'
    (0x5e, 7),        //  67 'C'
    (0x5f, 7),        //  68 'D'
    (0x60, 7),        //  69 'E'
    (0x61, 7),        //  70 'F'
    (0x62, 7),        //  71 'G'
    (0x63, 7),        //  72 'H'
    (0x64, 7),        //  73 'I'
    (0x65, 7),        //  74 'J'
    (0x66, 7),        //  75 'K'
    (0x67, 7),        //  76 'L'
    (0x68, 7),        //  77 'M'
    (0x69, 7),        //  78 'N'
    (0x6a, 7),        //  79 'O'
    (0x6b, 7),        //  80 'P'
    (0x6c, 7),        //  81 'Q'
    (0x6d, 7),        //  82 'R'
    (0x6e, 7),        //  83 'S'
    (0x6f, 7),        //  84 'T'
    (0x70, 7),        //  85 'U'
    (0x71, 7),        //  86 'V'
    (0x72, 7),        //  87 'W'
    (0xfc, 8),        //  88 'X'
    (0x73, 7),        //  89 'Y'
    (0xfd, 8),        //  90 'Z'
    (0x1ffb, 13),     //  91 '['
    (0x7fff0, 19),    //  92 '\\'
    (0x1ffc, 13),     //  93 ']'
    (0x3ffc, 14),     //  94 '^'
    (0x22, 6),        //  95 '_'
    (0x7ffd, 15),     //  96 '`'
    (0x3, 5),         //  97 'a'
    (0x23, 6),        //  98 'b'
    (0x4, 5),         //  99 'c'
    (0x24, 6),        // 100 'd'
    (0x5, 5),         // 101 'e'
    (0x25, 6),        // 102 'f'
    (0x26, 6),        // 103 'g'
    (0x27, 6),        // 104 'h'
    (0x6, 5),         // 105 'i'
    (0x74, 7),        // 106 'j'
    (0x75, 7),        // 107 'k'
    (0x28, 6),        // 108 'l'
    (0x29, 6),        // 109 'm'
    (0x2a, 6),        // 110 'n'
    (0x7, 5),         // 111 'o'
    (0x2b, 6),        // 112 'p'
    (0x76, 7),        // 113 'q'
    (0x2c, 6),        // 114 'r'
    (0x8, 5),         // 115 's'
    (0x9, 5),         // 116 't'
    (0x2d, 6),        // 117 'u'
    (0x77, 7),        // 118 'v'
    (0x78, 7),        // 119 'w'
    (0x79, 7),        // 120 'x'
    (0x7a, 7),        // 121 'y'
    (0x7b, 7),        // 122 'z'
    (0x7ffe, 15),     // 123 '{'
    (0x7fc, 11),      // 124 '|'
    (0x3ffd, 14),     // 125 '}'
    (0x1ffd, 13),     // 126 '~'
    (0xffffffc, 28),  // 127
    (0xfffe6, 20),    // 128
    (0x3fffd2, 22),   // 129
    (0xfffe7, 20),    // 130
    (0xfffe8, 20),    // 131
    (0x3fffd3, 22),   // 132
    (0x3fffd4, 22),   // 133
    (0x3fffd5, 22),   // 134
    (0x7fffd9, 23),   // 135
    (0x3fffd6, 22),   // 136
    (0x7fffda, 23),   // 137
    (0x7fffdb, 23),   // 138
    (0x7fffdc, 23),   // 139
    (0x7fffdd, 23),   // 140
    (0x7fffde, 23),   // 141
    (0xffffeb, 24),   // 142
    (0x7fffdf, 23),   // 143
    (0xffffec, 24),   // 144
    (0xffffed, 24),   // 145
    (0x3fffd7, 22),   // 146
    (0x7fffe0, 23),   // 147
    (0xffffee, 24),   // 148
    (0x7fffe1, 23),   // 149
    (0x7fffe2, 23),   // 150
    (0x7fffe3, 23),   // 151
    (0x7fffe4, 23),   // 152
    (0x1fffdc, 21),   // 153
    (0x3fffd8, 22),   // 154
    (0x7fffe5, 23),   // 155
    (0x3fffd9, 22),   // 156
    (0x7fffe6, 23),   // 157
    (0x7fffe7, 23),   // 158
    (0xffffef, 24),   // 159
    (0x3fffda, 22),   // 160
    (0x1fffdd, 21),   // 161
    (0xfffe9, 20),    // 162
    (0x3fffdb, 22),   // 163
    (0x3fffdc, 22),   // 164
    (0x7fffe8, 23),   // 165
    (0x7fffe9, 23),   // 166
    (0x1fffde, 21),   // 167
    (0x7fffea, 23),   // 168
    (0x3fffdd, 22),   // 169
    (0x3fffde, 22),   // 170
    (0xfffff0, 24),   // 171
    (0x1fffdf, 21),   // 172
    (0x3fffdf, 22),   // 173
    (0x7fffeb, 23),   // 174
    (0x7fffec, 23),   // 175
    (0x1fffe0, 21),   // 176
    (0x1fffe1, 21),   // 177
    (0x3fffe0, 22),   // 178
    (0x1fffe2, 21),   // 179
    (0x7fffed, 23),   // 180
    (0x3fffe1, 22),   // 181
    (0x7fffee, 23),   // 182
    (0x7fffef, 23),   // 183
    (0xfffea, 20),    // 184
    (0x3fffe2, 22),   // 185
    (0x3fffe3, 22),   // 186
    (0x3fffe4, 22),   // 187
    (0x7ffff0, 23),   // 188
    (0x3fffe5, 22),   // 189
    (0x3fffe6, 22),   // 190
    (0x7ffff1, 23),   // 191
    (0x3ffffe0, 26),  // 192
    (0x3ffffe1, 26),  // 193
    (0xfffeb, 20),    // 194
    (0x7fff1, 19),    // 195
    (0x3fffe7, 22),   // 196
    (0x7ffff2, 23),   // 197
    (0x3fffe8, 22),   // 198
    (0x1ffffec, 25),  // 199
    (0x3ffffe2, 26),  // 200
    (0x3ffffe3, 26),  // 201
    (0x3ffffe4, 26),  // 202
    (0x7ffffde, 27),  // 203
    (0x7ffffdf, 27),  // 204
    (0x3ffffe5, 26),  // 205
    (0xfffff1, 24),   // 206
    (0x1ffffed, 25),  // 207
    (0x7fff2, 19),    // 208
    (0x1fffe3, 21),   // 209
    (0x3ffffe6, 26),  // 210
    (0x7ffffe0, 27),  // 211
    (0x7ffffe1, 27),  // 212
    (0x3ffffe7, 26),  // 213
    (0x7ffffe2, 27),  // 214
    (0xfffff2, 24),   // 215
    (0x1fffe4, 21),   // 216
    (0x1fffe5, 21),   // 217
    (0x3ffffe8, 26),  // 218
    (0x3ffffe9, 26),  // 219
    (0xffffffd, 28),  // 220
    (0x7ffffe3, 27),  // 221
    (0x7ffffe4, 27),  // 222
    (0x7ffffe5, 27),  // 223
    (0xfffec, 20),    // 224
    (0xfffff3, 24),   // 225
    (0xfffed, 20),    // 226
    (0x1fffe6, 21),   // 227
    (0x3fffe9, 22),   // 228
    (0x1fffe7, 21),   // 229
    (0x1fffe8, 21),   // 230
    (0x7ffff3, 23),   // 231
    (0x3fffea, 22),   // 232
    (0x3fffeb, 22),   // 233
    (0x1ffffee, 25),  // 234
    (0x1ffffef, 25),  // 235
    (0xfffff4, 24),   // 236
    (0xfffff5, 24),   // 237
    (0x3ffffea, 26),  // 238
    (0x7ffff4, 23),   // 239
    (0x3ffffeb, 26),  // 240
    (0x7ffffe6, 27),  // 241
    (0x3ffffec, 26),  // 242
    (0x3ffffed, 26),  // 243
    (0x7ffffe7, 27),  // 244
    (0x7ffffe8, 27),  // 245
    (0x7ffffe9, 27),  // 246
    (0x7ffffea, 27),  // 247
    (0x7ffffeb, 27),  // 248
    (0xffffffe, 28),  // 249
    (0x7ffffec, 27),  // 250
    (0x7ffffed, 27),  // 251
    (0x7ffffee, 27),  // 252
    (0x7ffffef, 27),  // 253
    (0x7fffff0, 27),  // 254
    (0x3ffffee, 26),  // 255
    (0x3fffffff, 30), // EOS
];

/// The EOS symbol, which no string may contain.
const EOS: usize = 256;

/// The length in bytes of `bytes` Huffman-encoded: an encoder compares it with
/// `bytes.len()` to choose the shorter representation, and sizes the string's length
/// prefix before encoding.
pub fn encoded_len(bytes: &[u8]) -> usize {
    let bits: usize = bytes
        .iter()
        .map(|&b| usize::from(CODES[b as usize].1))
        .sum();
    bits.div_ceil(8)
}

/// Appends `bytes` Huffman-encoded to `out`, the last byte padded with ones (the start
/// of EOS, section 5.2).
///
/// Codes are gathered in a 64-bit accumulator and written four bytes at a time: with
/// fewer than 32 bits pending, one more code of at most 30 bits still fits.
pub fn encode(bytes: &[u8], out: &mut Vec<u8>) {
    out.reserve(encoded_len(bytes));
    // The low `pending` bits of `acc` are the bits not yet written, oldest highest;
    // bits above them are stale and shifted out or ignored.
    let mut acc: u64 = 0;
    let mut pending: u32 = 0;
    for &b in bytes {
        let (code, len) = CODES[b as usize];
        acc = (acc << len) | u64::from(code);
        pending += u32::from(len);
        if pending >= 32 {
            pending -= 32;
            out.extend_from_slice(&((acc >> pending) as u32).to_be_bytes());
        }
    }
    // Pad to a whole byte with ones, then write what is left.
    let pad = pending.wrapping_neg() % 8;
    acc = (acc << pad) | ((1 << pad) - 1);
    pending += pad;
    while pending > 0 {
        pending -= 8;
        out.push((acc >> pending) as u8);
    }
}

/// Appends the decoding of the Huffman-encoded `bytes` to `out`; refuses a string that
/// contains EOS or whose padding is longer than 7 bits or not all ones (section 5.2),
/// since a valid encoder never sends one. On an error, part of the string may have
/// been appended to `out`, for the caller to discard with the field block.
///
/// Reads four bits at a time through `STEPS`, a state machine over the code tree.
pub fn decode(bytes: &[u8], out: &mut Vec<u8>) -> Result<(), HpackError> {
    // Every code is at least 5 bits long.
    out.reserve(bytes.len() * 8 / 5);
    let mut state = 0;
    // The empty string is valid: no symbol, no padding.
    let mut flags = ACCEPT;
    for &byte in bytes {
        for nibble in [byte >> 4, byte & 0x0f] {
            let step = STEPS[usize::from(state) << 4 | usize::from(nibble)];
            if step.flags & FAIL != 0 {
                return Err(HpackError::Huffman);
            }
            if step.flags & EMIT != 0 {
                out.push(step.symbol);
            }
            state = step.next;
            flags = step.flags;
        }
    }
    if flags & ACCEPT == 0 {
        return Err(HpackError::Huffman);
    }
    Ok(())
}

/// A child in [`Tree`] that is a symbol rather than a node.
const LEAF: u16 = 0x8000;

/// The code tree: 257 symbols make 256 internal nodes, the root first. A node's
/// children (bit 0, bit 1) are node indexes or, with [`LEAF`] set, symbols.
type Tree = [[u16; 2]; 256];

/// Builds the tree from [`CODES`], failing the build if the codes are not a complete
/// prefix code: then every node has two children and every bit string is a path
/// through symbols, so the decoder has no case for a bit leading nowhere.
const fn tree() -> Tree {
    // 0 marks a missing child: the root is no node's child.
    let mut tree = [[0u16; 2]; 256];
    let mut nodes = 1;
    let mut symbol = 0;
    while symbol < CODES.len() {
        let (code, len) = CODES[symbol];
        assert!(
            len >= 5 && len <= 30 && (code >> len) == 0,
            "a code out of range"
        );
        let mut node = 0;
        let mut i = len - 1;
        while i > 0 {
            let bit = ((code >> i) & 1) as usize;
            if tree[node][bit] == 0 {
                assert!(nodes < tree.len(), "more nodes than a prefix code has");
                tree[node][bit] = nodes as u16;
                nodes += 1;
            }
            assert!(tree[node][bit] & LEAF == 0, "a code extends another");
            node = tree[node][bit] as usize;
            i -= 1;
        }
        let bit = (code & 1) as usize;
        assert!(tree[node][bit] == 0, "a code is a prefix of another");
        tree[node][bit] = LEAF | symbol as u16;
        symbol += 1;
    }
    let mut node = 0;
    while node < tree.len() {
        assert!(
            tree[node][0] != 0 && tree[node][1] != 0,
            "an incomplete code"
        );
        node += 1;
    }
    tree
}

/// One transition of the decoder: from a state (a tree node, where the bits read since
/// the last symbol lead) on a nibble.
#[derive(Clone, Copy)]
struct Step {
    /// The state after the nibble.
    next: u8,
    /// The symbol the nibble completed, if `flags` has [`EMIT`].
    symbol: u8,
    flags: u8,
}

/// The nibble completed a symbol (at most one: no code is shorter than 5 bits).
const EMIT: u8 = 1;
/// The string may end here: the bits since the last symbol are at most 7 ones, a
/// prefix of EOS.
const ACCEPT: u8 = 2;
/// The nibble completed EOS.
const FAIL: u8 = 4;

/// The decoder's transitions, 16 per state: 256 × 16 × 3 bytes = 12 KiB, in the L1
/// cache while a block is decoded. Byte-at-a-time steps would halve the lookups but
/// take 256 KiB, and emit up to two symbols each.
static STEPS: [Step; 256 * 16] = steps();

/// Walks every state's 16 nibbles through the tree.
const fn steps() -> [Step; 256 * 16] {
    let tree = tree();
    // The states where a string may end: the root and the all-ones path below it, to
    // depth 7. EOS is 30 ones, so none of these is a leaf.
    let mut accepting = [false; 256];
    let mut node = 0;
    let mut depth = 0;
    while depth <= 7 {
        accepting[node] = true;
        node = tree[node][1] as usize;
        depth += 1;
    }
    let mut steps = [Step {
        next: 0,
        symbol: 0,
        flags: 0,
    }; 256 * 16];
    let mut state = 0;
    while state < 256 {
        let mut nibble = 0;
        while nibble < 16 {
            let mut step = Step {
                next: 0,
                symbol: 0,
                flags: 0,
            };
            let mut node = state;
            let mut i = 4;
            while i > 0 {
                i -= 1;
                let child = tree[node][(nibble >> i) & 1];
                if child & LEAF == 0 {
                    node = child as usize;
                } else if (child & !LEAF) as usize == EOS {
                    step.flags = FAIL;
                    break;
                } else {
                    assert!(step.flags & EMIT == 0, "two symbols in a nibble");
                    step.flags = EMIT;
                    step.symbol = child as u8;
                    node = 0;
                }
            }
            if step.flags & FAIL == 0 {
                step.next = node as u8;
                if accepting[node] {
                    step.flags |= ACCEPT;
                }
            }
            steps[state << 4 | nibble] = step;
            nibble += 1;
        }
        state += 1;
    }
    steps
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::process::{Command, Stdio};

    use proptest::prelude::*;

    use super::*;

    /// RFC 7541 Appendix C.4 (requests) and C.6 (responses).
    const EXAMPLES: [(&str, &str); 8] = [
        ("www.example.com", "f1e3c2e5f23a6ba0ab90f4ff"),
        ("no-cache", "a8eb10649cbf"),
        ("custom-key", "25a849e95ba97d7f"),
        ("custom-value", "25a849e95bb8e8b4bf"),
        ("302", "6402"),
        ("private", "aec3771a4b"),
        (
            "Mon, 21 Oct 2013 20:13:21 GMT",
            "d07abe941054d444a8200595040b8166e082a62d1bff",
        ),
        (
            "https://www.example.com",
            "9d29ad171863c78f0b97c8e9ae82ae43d3",
        ),
    ];

    fn encoded(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode(bytes, &mut out);
        out
    }

    fn decoded(bytes: &[u8]) -> Result<Vec<u8>, HpackError> {
        let mut out = Vec::new();
        decode(bytes, &mut out).map(|()| out)
    }

    /// Symbols' codes written one after another, the last byte padded with `pad`'s
    /// high bits: strings no encoder makes, for the errors.
    fn bits(symbols: &[usize], pad: u8) -> Vec<u8> {
        let mut out = Vec::new();
        let (mut acc, mut pending) = (0u64, 0);
        for &s in symbols {
            let (code, len) = CODES[s];
            acc = acc << len | u64::from(code);
            pending += len;
            while pending >= 8 {
                pending -= 8;
                out.push((acc >> pending) as u8);
            }
        }
        if pending > 0 {
            out.push((acc << (8 - pending)) as u8 | pad >> pending);
        }
        out
    }

    #[test]
    fn the_rfc_examples() {
        for (text, hex) in EXAMPLES {
            let code = unhex(hex);
            assert_eq!(encoded(text.as_bytes()), code, "{text}");
            assert_eq!(encoded_len(text.as_bytes()), code.len(), "{text}");
            assert_eq!(decoded(&code), Ok(text.as_bytes().to_vec()), "{text}");
        }
    }

    #[test]
    fn encoding_appends() {
        let mut out = b"x".to_vec();
        encode(b"302", &mut out);
        assert_eq!(out, [b'x', 0x64, 0x02]);
        decode(&[0x64, 0x02], &mut out).unwrap();
        assert_eq!(out, b"x\x64\x02302");
    }

    #[test]
    fn the_empty_string_is_empty() {
        assert_eq!(encoded(b""), b"");
        assert_eq!(encoded_len(b""), 0);
        assert_eq!(decoded(b""), Ok(Vec::new()));
    }

    #[test]
    fn eos_is_refused() {
        let a = usize::from(b'a');
        assert_eq!(bits(&[a, EOS, a], 0xff), [0x1f, 0xff, 0xff, 0xff, 0xe3]);
        for symbols in [&[EOS][..], &[a, EOS], &[EOS, a], &[a, EOS, a], &[a, a, EOS]] {
            assert_eq!(
                decoded(&bits(symbols, 0xff)),
                Err(HpackError::Huffman),
                "{symbols:?}"
            );
        }
    }

    #[test]
    fn padding_longer_than_7_bits_is_refused() {
        // "302" ends on a byte boundary, "www.example.com" three bits short of one.
        assert_eq!(decoded(&[0x64, 0x02, 0xff]), Err(HpackError::Huffman));
        let mut code = unhex(EXAMPLES[0].1);
        code.push(0xff);
        assert_eq!(decoded(&code), Err(HpackError::Huffman));
        // Padding alone: 8 ones, and 7 (a string of 25 bits: "aaaaa").
        assert_eq!(decoded(&[0xff]), Err(HpackError::Huffman));
        assert_eq!(bits(&[usize::from(b'a'); 5], 0xff).len(), 4);
        assert_eq!(
            decoded(&bits(&[usize::from(b'a'); 5], 0xff)),
            Ok(b"aaaaa".to_vec())
        );
    }

    #[test]
    fn padding_other_than_ones_is_refused() {
        // "a" is 00011: padded with 111 it is 0x1f, with 000 or 110 it is refused.
        assert_eq!(decoded(&[0x1f]), Ok(b"a".to_vec()));
        assert_eq!(decoded(&[0x18]), Err(HpackError::Huffman));
        assert_eq!(decoded(&[0x1e]), Err(HpackError::Huffman));
        // Seven bits of padding, 1111110: the start of some codes, but not of EOS.
        assert_eq!(
            decoded(&bits(&[usize::from(b'a'); 5], 0xfc)),
            Err(HpackError::Huffman)
        );
    }

    proptest! {
        #[test]
        fn every_string_round_trips(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let code = encoded(&bytes);
            prop_assert_eq!(code.len(), encoded_len(&bytes));
            prop_assert_eq!(decoded(&code), Ok(bytes));
        }

        /// An encoding is unique (the padding being fixed), so whatever decodes is the
        /// encoding of what it decodes to.
        #[test]
        fn what_decodes_is_an_encoding(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(text) = decoded(&bytes) {
                prop_assert_eq!(encoded(&text), bytes);
            }
        }
    }

    /// Against Python's `hpack` (python-hyper's, which the `h2` package uses): its
    /// encoder and its decoder, a state machine of its own, on pseudo-random strings,
    /// their encodings cut short or not, and random bytes, most of them invalid.
    #[test]
    fn encodings_and_decodings_are_python_hpacks() {
        let found = Command::new("python3")
            .args(["-c", "import hpack.huffman, hpack.huffman_table"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !terminus_testkit::runs_here(
            terminus_testkit::Need::PythonPackages,
            found,
            "no Python `hpack` package (pip install h2)",
        ) {
            return;
        }
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut strings: Vec<Vec<u8>> = vec![(0..=255).collect(), Vec::new()];
        for i in 0..300 {
            let len = next() as usize % 300;
            // Some strings from header-like bytes, where the short codes are.
            let range = if i % 2 == 0 { 256 } else { 64 };
            strings.push(
                (0..len)
                    .map(|_| (next() % range) as u8 + (256 - range) as u8 / 2)
                    .collect(),
            );
        }
        let mut codes: Vec<Vec<u8>> = Vec::new();
        for s in &strings {
            let code = encoded(s);
            let cut = code.len().saturating_sub(1 + next() as usize % 3);
            codes.push(code[..cut].to_vec());
            codes.push(code);
            codes.push((0..next() as usize % 8).map(|_| next() as u8).collect());
        }
        let mut input = String::new();
        for s in &strings {
            input += &format!("e {}\n", hex(s));
        }
        for c in &codes {
            input += &format!("d {}\n", hex(c));
        }
        let script = "import sys\n\
                      from hpack.exceptions import HPACKDecodingError\n\
                      from hpack.huffman import HuffmanEncoder\n\
                      from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH\n\
                      from hpack.huffman_table import decode_huffman\n\
                      encoder = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH)\n\
                      for line in sys.stdin:\n    \
                          op, _, h = line.strip().partition(' ')\n    \
                          b = bytes.fromhex(h)\n    \
                          if op == 'e':\n        \
                              print(encoder.encode(b).hex())\n    \
                          else:\n        \
                              try:\n            \
                                  print(decode_huffman(b).hex())\n        \
                              except HPACKDecodingError:\n            \
                                  print('error')";
        let mut child = Command::new("python3")
            .args(["-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // Written from another thread: Python answers line by line, and would block on
        // a full stdout pipe while this one blocks on a full stdin.
        let mut stdin = child.stdin.take().unwrap();
        let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        let mut lines = text.lines();
        for s in &strings {
            assert_eq!(hex(&encoded(s)), lines.next().unwrap(), "encoding {s:02x?}");
        }
        let mut errors = 0;
        for c in &codes {
            let ours = match decoded(c) {
                Ok(text) => hex(&text),
                Err(_) => {
                    errors += 1;
                    "error".to_owned()
                }
            };
            assert_eq!(ours, lines.next().unwrap(), "decoding {c:02x?}");
        }
        assert_eq!(lines.next(), None);
        // Both outcomes were compared, many times.
        assert!(
            errors > 100 && errors < codes.len() - 300,
            "{errors} errors"
        );
    }

    /// Throughput on header-like strings, printed: a check that the tables are
    /// looked up, not rebuilt, and that no step went quadratic.
    #[test]
    #[ignore = "timing: cargo test --release -- --ignored decoding_speed --nocapture"]
    fn decoding_speed() {
        let text = b"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) \
                     Chrome/126.0.0.0 Safari/537.36; text/html,application/xhtml+xml";
        let code = encoded(text);
        let mut out = Vec::with_capacity(text.len());
        let rounds = 200_000;
        let start = std::time::Instant::now();
        for _ in 0..rounds {
            out.clear();
            decode(std::hint::black_box(&code), &mut out).unwrap();
        }
        let decoding = start.elapsed();
        let mut code_out = Vec::with_capacity(code.len());
        let start = std::time::Instant::now();
        for _ in 0..rounds {
            code_out.clear();
            encode(std::hint::black_box(text), &mut code_out);
        }
        let encoding = start.elapsed();
        assert_eq!((&out[..], &code_out), (&text[..], &code));
        let mb = |t: std::time::Duration| (rounds * text.len()) as f64 / t.as_secs_f64() / 1e6;
        println!(
            "decode {:.0} MB/s, encode {:.0} MB/s (of text)",
            mb(decoding),
            mb(encoding)
        );
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }
}
