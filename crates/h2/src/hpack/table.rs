//! HPACK's static table (RFC 7541 Appendix A): 61 fields every peer knows by index,
//! index 1 first.

/// The static table, `STATIC[i - 1]` being index `i`.
pub const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// The static entry at HPACK index `index` (1 to 61).
pub fn static_entry(index: u32) -> Option<(&'static [u8], &'static [u8])> {
    let i = usize::try_from(index).ok()?.checked_sub(1)?;
    STATIC.get(i).copied()
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    #[test]
    fn indexes_start_at_one_and_end_at_61() {
        assert_eq!(static_entry(0), None);
        assert_eq!(static_entry(2), Some((&b":method"[..], &b"GET"[..])));
        assert_eq!(static_entry(8), Some((&b":status"[..], &b"200"[..])));
        assert_eq!(static_entry(61), Some((&b"www-authenticate"[..], &b""[..])));
        assert_eq!(static_entry(62), None);
    }

    /// The table against Python's `hpack` (python-hyper's, which the `h2` package uses),
    /// an independent copy of Appendix A.
    #[test]
    fn the_static_table_is_python_hpacks() {
        let script = "from hpack.table import HeaderTable\n\
                      for n, v in HeaderTable.STATIC_TABLE:\n    print(n.hex(), v.hex())";
        let out = Command::new("python3").args(["-c", script]).output();
        let found = out.as_ref().is_ok_and(|o| o.status.success());
        if !terminus_testkit::runs_here(
            terminus_testkit::Need::PythonPackages,
            found,
            "no Python `hpack` package (pip install h2)",
        ) {
            return;
        }
        let text = String::from_utf8(out.unwrap().stdout).unwrap();
        let theirs: Vec<(Vec<u8>, Vec<u8>)> = text
            .lines()
            .map(|l| {
                let (n, v) = l.split_once(' ').unwrap();
                (hex(n), hex(v))
            })
            .collect();
        let ours: Vec<(Vec<u8>, Vec<u8>)> = STATIC
            .iter()
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect();
        assert_eq!(ours, theirs);
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }
}
