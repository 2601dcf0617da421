//! Record framing before anything is decrypted: where whole records end.
//!
//! The handshake gives rustls whole records only, so that when it ends no record is half
//! inside rustls: the kernel (kTLS) or terminus's own record layer can take over the
//! connection only at a record boundary, with the rest of the bytes still in terminus's
//! hands.

/// Whether a record header (five bytes) is one some TLS record could have: a known
/// content type, version 3.x, no longer than any version allows. A reader that waits for
/// the rest of a record must not wait on one that is not.
pub fn plausible_header(header: &[u8]) -> bool {
    const MAX_CIPHERTEXT: usize = 16384 + 2048;
    let len = u16::from_be_bytes([header[3], header[4]]) as usize;
    (20..=24).contains(&header[0]) && header[1] == 3 && len <= MAX_CIPHERTEXT
}

/// Length of the longest prefix of `buf` made of whole TLS records. A header that no
/// valid record has (unknown type, not version 3.x, longer than any record) counts as
/// whole when it comes first, so rustls sees it and rejects it at once instead of us
/// waiting for bytes that will never be valid (plain HTTP sent to the TLS port, say).
pub fn whole_records(buf: &[u8]) -> usize {
    whole_records_within(buf, usize::MAX)
}

/// [`whole_records`], stopping before the record that would take the prefix past `limit`
/// bytes; the first record counts whatever its size.
pub fn whole_records_within(buf: &[u8], limit: usize) -> usize {
    let mut at = 0;
    while let Some(header) = buf.get(at..at + 5) {
        let len = u16::from_be_bytes([header[3], header[4]]) as usize;
        if !plausible_header(header) {
            // Handed on whole only when it comes first: the records before it are taken
            // on their own (the handshake's last may be among them, and nothing after
            // that record is rustls's).
            return if at == 0 { buf.len() } else { at };
        }
        let end = at + 5 + len;
        if end > buf.len() || (at > 0 && end > limit) {
            break;
        }
        at = end;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_records_stops_at_a_partial_record() {
        let mut buf = vec![23, 3, 3, 0, 2, 9, 9, 23, 3, 3, 0, 4, 1];
        assert_eq!(whole_records(&buf), 7);
        buf.extend_from_slice(&[2, 3, 4]);
        assert_eq!(whole_records(&buf), 16);
        assert_eq!(whole_records(&buf[..3]), 0);
        // An impossible length is handed on for rustls to reject.
        assert_eq!(whole_records(&[22, 3, 3, 0xff, 0xff, 1]), 6);
        assert_eq!(whole_records(b"GET / HTTP/1.1\r\n"), 16);
        // One after whole records waits its turn (DTLS's version, which rustls reads).
        let then_invalid = [&buf[..7], &[23, 0xfe, 0xff, 0, 1, 0][..]].concat();
        assert_eq!(whole_records(&then_invalid), 7);
        assert_eq!(whole_records(&then_invalid[7..]), 6);
        // Within a limit: at least the first record, then only what fits.
        assert_eq!(whole_records_within(&buf, 1), 7);
        assert_eq!(whole_records_within(&buf, 15), 7);
        assert_eq!(whole_records_within(&buf, 16), 16);
    }

    mod properties {
        use super::super::whole_records;
        use proptest::prelude::*;
        use proptest::sample::Index;

        proptest! {
            // A bounded number of cases, so CI time stays predictable.
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn never_more_than_the_buffer(buf in prop::collection::vec(any::<u8>(), 0..2048)) {
                prop_assert!(whole_records(&buf) <= buf.len());
            }

            /// Valid records cut anywhere: exactly the records before the cut are whole.
            #[test]
            fn stops_at_the_last_record_boundary(
                records in prop::collection::vec(
                    (20u8..=24, 0u8..=4, prop::collection::vec(any::<u8>(), 0..600)),
                    1..6,
                ),
                cut in any::<Index>(),
            ) {
                let mut buf = Vec::new();
                let mut bounds = vec![0];
                for (kind, minor, body) in &records {
                    buf.extend_from_slice(&[*kind, 3, *minor]);
                    buf.extend_from_slice(&(body.len() as u16).to_be_bytes());
                    buf.extend_from_slice(body);
                    bounds.push(buf.len());
                }
                let k = cut.index(buf.len() + 1);
                let expected = bounds.iter().copied().filter(|&b| b <= k).max().unwrap();
                prop_assert_eq!(whole_records(&buf[..k]), expected);
            }
        }
    }
}
