//! The PROXY protocol (HAProxy's, versions 1 and 2): a header at the start of a TCP
//! connection that says which client and which address it came in on, for a server behind
//! a proxy. terminus sends one on each new upstream connection where the upstream asks
//! for it; [`parse`] reads one (for listeners behind an L4 balancer).

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// Which header an upstream's connections start with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// Text: `PROXY TCP4 src dst sport dport\r\n`.
    V1,
    /// Binary, fixed layout.
    V2,
}

const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// The header for a connection from `client` that came in on `local`.
pub fn encode(version: Version, client: SocketAddr, local: SocketAddr) -> Vec<u8> {
    match version {
        Version::V1 => match (client.ip(), local.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                format!("PROXY TCP4 {s} {d} {} {}\r\n", client.port(), local.port()).into_bytes()
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                format!("PROXY TCP6 {s} {d} {} {}\r\n", client.port(), local.port()).into_bytes()
            }
            // One family for both, as the format wants: IPv4 as IPv4-mapped IPv6.
            (s, d) => format!(
                "PROXY TCP6 {} {} {} {}\r\n",
                v6(s),
                v6(d),
                client.port(),
                local.port()
            )
            .into_bytes(),
        },
        Version::V2 => {
            let mut out = Vec::with_capacity(52);
            out.extend_from_slice(&V2_SIGNATURE);
            out.push(0x21); // version 2, PROXY command
            match (client.ip(), local.ip()) {
                (IpAddr::V4(s), IpAddr::V4(d)) => {
                    out.push(0x11); // TCP over IPv4
                    out.extend_from_slice(&12u16.to_be_bytes());
                    out.extend_from_slice(&s.octets());
                    out.extend_from_slice(&d.octets());
                }
                (s, d) => {
                    out.push(0x21); // TCP over IPv6
                    out.extend_from_slice(&36u16.to_be_bytes());
                    out.extend_from_slice(&v6(s).octets());
                    out.extend_from_slice(&v6(d).octets());
                }
            }
            out.extend_from_slice(&client.port().to_be_bytes());
            out.extend_from_slice(&local.port().to_be_bytes());
            out
        }
    }
}

fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// A parsed header: the client and the address it came in on (`None` for `UNKNOWN` and
/// v2's LOCAL command: the connection is the balancer's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// (client, local), when the header carries them.
    pub addresses: Option<(SocketAddr, SocketAddr)>,
    /// How many bytes the header took.
    pub len: usize,
}

/// Reads a header at the start of `buf`: `Ok(None)` wants more bytes, `Err` is not a
/// valid header (the connection should be closed).
pub fn parse(buf: &[u8]) -> Result<Option<Header>, &'static str> {
    if buf.len() >= 12 && buf[..12] == V2_SIGNATURE {
        return parse_v2(buf);
    }
    if buf.starts_with(b"PROXY ") {
        return parse_v1(buf);
    }
    let prefix = |full: &[u8]| full.starts_with(&buf[..buf.len().min(full.len())]);
    if prefix(&V2_SIGNATURE) || prefix(b"PROXY ") {
        return Ok(None);
    }
    Err("not a PROXY protocol header")
}

fn parse_v1(buf: &[u8]) -> Result<Option<Header>, &'static str> {
    // At most 107 bytes, CRLF included.
    let Some(end) = buf.windows(2).take(106).position(|w| w == b"\r\n") else {
        return if buf.len() >= 107 {
            Err("PROXY v1 line too long")
        } else {
            Ok(None)
        };
    };
    let line = std::str::from_utf8(&buf[..end]).map_err(|_| "PROXY v1 line not text")?;
    let fields: Vec<&str> = line.split(' ').collect();
    let len = end + 2;
    match fields.as_slice() {
        ["PROXY", "UNKNOWN", ..] => Ok(Some(Header {
            addresses: None,
            len,
        })),
        ["PROXY", family @ ("TCP4" | "TCP6"), src, dst, sport, dport] => {
            let ip = |s: &str| s.parse::<IpAddr>().map_err(|_| "bad address in PROXY v1");
            let port = |s: &str| s.parse::<u16>().map_err(|_| "bad port in PROXY v1");
            let (src, dst) = (ip(src)?, ip(dst)?);
            if (*family == "TCP4") != (src.is_ipv4() && dst.is_ipv4()) {
                return Err("PROXY v1 addresses do not match their family");
            }
            let addresses = (
                SocketAddr::new(src, port(sport)?),
                SocketAddr::new(dst, port(dport)?),
            );
            Ok(Some(Header {
                addresses: Some(addresses),
                len,
            }))
        }
        _ => Err("malformed PROXY v1 line"),
    }
}

fn parse_v2(buf: &[u8]) -> Result<Option<Header>, &'static str> {
    if buf.len() < 16 {
        return Ok(None);
    }
    let (version, command) = (buf[12] >> 4, buf[12] & 0x0f);
    if version != 2 || command > 1 {
        return Err("bad PROXY v2 version or command");
    }
    let body = u16::from_be_bytes([buf[14], buf[15]]) as usize;
    let len = 16 + body;
    if buf.len() < len {
        return Ok(None);
    }
    let a = &buf[16..len];
    let addresses = match (command, buf[13]) {
        (0, _) => None, // LOCAL: the balancer's own connection (a health check)
        (_, 0x11) if a.len() >= 12 => {
            let ip = |b: &[u8]| IpAddr::from([b[0], b[1], b[2], b[3]]);
            let port = |b: &[u8]| u16::from_be_bytes([b[0], b[1]]);
            Some((
                SocketAddr::new(ip(&a[0..4]), port(&a[8..10])),
                SocketAddr::new(ip(&a[4..8]), port(&a[10..12])),
            ))
        }
        (_, 0x21) if a.len() >= 36 => {
            let ip = |b: &[u8]| IpAddr::from(<[u8; 16]>::try_from(b).expect("16 bytes"));
            let port = |b: &[u8]| u16::from_be_bytes([b[0], b[1]]);
            Some((
                SocketAddr::new(ip(&a[0..16]), port(&a[32..34])),
                SocketAddr::new(ip(&a[16..32]), port(&a[34..36])),
            ))
        }
        (_, 0x00) => None, // UNSPEC
        _ => return Err("PROXY v2 address family not TCP over IPv4 or IPv6"),
    };
    Ok(Some(Header { addresses, len }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_split_reads_wait_for_more() {
        let pairs: [(SocketAddr, SocketAddr); 3] = [
            (
                "192.0.2.1:5555".parse().unwrap(),
                "198.51.100.2:443".parse().unwrap(),
            ),
            (
                "[2001:db8::1]:5555".parse().unwrap(),
                "[2001:db8::2]:443".parse().unwrap(),
            ),
            (
                "192.0.2.1:5555".parse().unwrap(),
                "[2001:db8::2]:443".parse().unwrap(),
            ),
        ];
        for version in [Version::V1, Version::V2] {
            for (client, local) in pairs {
                let mut wire = encode(version, client, local);
                let whole = wire.len();
                for cut in 0..whole {
                    assert_eq!(parse(&wire[..cut]), Ok(None), "{version:?} cut at {cut}");
                }
                wire.extend_from_slice(b"\x16\x03\x01");
                let header = parse(&wire).unwrap().unwrap();
                assert_eq!(header.len, whole);
                let (c, l) = header.addresses.unwrap();
                assert_eq!((v6(c.ip()), c.port()), (v6(client.ip()), client.port()));
                assert_eq!((v6(l.ip()), l.port()), (v6(local.ip()), local.port()));
            }
        }
        assert_eq!(
            encode(Version::V1, pairs[0].0, pairs[0].1),
            b"PROXY TCP4 192.0.2.1 198.51.100.2 5555 443\r\n"
        );
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            &b"\x16\x03\x01\x02\x00"[..],
            b"GET / HTTP/1.1\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n",
            b"PROXY TCP4 ::1 ::2 1 2\r\n",
            b"PROXY TCP9 1.2.3.4 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 99999 2\r\n",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let long = [b"PROXY ".as_slice(), &[b'1'; 120]].concat();
        assert!(parse(&long).is_err());
        assert_eq!(
            parse(b"PROXY UNKNOWN\r\n"),
            Ok(Some(Header {
                addresses: None,
                len: 15
            }))
        );
    }
}
