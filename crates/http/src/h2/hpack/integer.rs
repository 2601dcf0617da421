//! Integers with an N-bit prefix (RFC 7541 section 5.1): indexes, lengths and table
//! sizes, the low N bits of a representation's first byte and, when those are all ones,
//! continuation bytes of 7 bits each, least significant first.

use super::HpackError;

/// The largest integer decoded: 2^28 - 1. Every HPACK integer is an index, a string
/// length or a table size, and none a server accepts comes near it (a field block is at
/// most a few hundred KiB); a larger one is an attack on the decoder, refused after at
/// most five continuation bytes rather than read on without end.
pub const MAX: u32 = (1 << 28) - 1;

/// Appends `value` with an `n`-bit prefix (1 ≤ n ≤ 8); `first` holds the representation's
/// bits above the prefix.
pub fn encode(value: u32, n: u8, first: u8, out: &mut Vec<u8>) {
    debug_assert!((1..=8).contains(&n));
    let limit = (1u32 << n) - 1;
    if value < limit {
        out.push(first | value as u8);
        return;
    }
    out.push(first | limit as u8);
    let mut rest = value - limit;
    while rest >= 0x80 {
        out.push((rest & 0x7f) as u8 | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// Reads an integer with an `n`-bit prefix from the start of `bytes`: its value and the
/// bytes it took.
pub fn decode(bytes: &[u8], n: u8) -> Result<(u32, usize), HpackError> {
    debug_assert!((1..=8).contains(&n));
    let limit = (1u32 << n) - 1;
    let first = u32::from(*bytes.first().ok_or(HpackError::Truncated)?) & limit;
    if first < limit {
        return Ok((first, 1));
    }
    let mut value = limit;
    for (i, &byte) in bytes[1..].iter().enumerate() {
        let shift = 7 * i as u32;
        // Past 2^28 in at most five bytes (a sixth, or a zero-padded encoding that long,
        // is refused either way).
        if shift > 21 {
            return Err(HpackError::IntegerOverflow);
        }
        value += u32::from(byte & 0x7f) << shift;
        if value > MAX {
            return Err(HpackError::IntegerOverflow);
        }
        if byte & 0x80 == 0 {
            return Ok((value, i + 2));
        }
    }
    Err(HpackError::Truncated)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// RFC 7541 Appendix C.1.
    #[test]
    fn the_rfc_examples() {
        let mut out = Vec::new();
        encode(10, 5, 0, &mut out);
        assert_eq!(out, [0x0a]);
        out.clear();
        encode(1337, 5, 0, &mut out);
        assert_eq!(out, [0x1f, 0x9a, 0x0a]);
        out.clear();
        encode(42, 8, 0, &mut out);
        assert_eq!(out, [0x2a]);
        assert_eq!(
            decode(&[0xea], 5),
            Ok((10, 1)),
            "bits above the prefix ignored"
        );
        assert_eq!(decode(&[0x1f, 0x9a, 0x0a, 0xff], 5), Ok((1337, 3)));
        assert_eq!(decode(&[0x2a], 8), Ok((42, 1)));
    }

    #[test]
    fn truncated_and_oversized_integers_are_refused() {
        assert_eq!(decode(&[], 5), Err(HpackError::Truncated));
        assert_eq!(decode(&[0x1f, 0x80], 5), Err(HpackError::Truncated));
        assert_eq!(
            decode(&[0x1f, 0xff, 0xff, 0xff, 0xff, 0x0f], 5),
            Err(HpackError::IntegerOverflow)
        );
        // Endless continuation bytes end at the sixth.
        assert_eq!(
            decode(&[0x1f, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80], 5),
            Err(HpackError::IntegerOverflow)
        );
        let mut out = Vec::new();
        encode(MAX, 5, 0, &mut out);
        assert_eq!(decode(&out, 5), Ok((MAX, out.len())));
    }

    proptest! {
        #[test]
        fn every_value_round_trips(value in 0..=MAX, n in 1u8..=8, first in any::<u8>()) {
            let high = if n == 8 { 0 } else { first & !((1u8 << n) - 1) };
            let mut out = Vec::new();
            encode(value, n, high, &mut out);
            prop_assert_eq!(out[0] & !(((1u16 << n) - 1) as u8), high);
            prop_assert_eq!(decode(&out, n), Ok((value, out.len())));
        }
    }
}
