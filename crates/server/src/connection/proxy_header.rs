//! A PROXY protocol header (v1 or v2) in front of the TLS bytes, from an L4 load balancer
//! on a `trusted` network: read before the ClientHello, without taking any byte past it,
//! and the client's address taken from it. A connection from elsewhere is served as it
//! is (a header from an untrusted peer is just bytes that fail the handshake).

use std::io;
use std::net::{IpAddr, SocketAddr};

use terminus_proxy::proxy_protocol;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// An IP network, `ADDR/PREFIX` (or one address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// `"10.0.0.0/8"`, `"2001:db8::/32"`, or a single address.
    pub fn parse(text: &str) -> Option<Cidr> {
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a.parse::<IpAddr>().ok()?, p.parse::<u8>().ok()?),
            None => {
                let a = text.parse::<IpAddr>().ok()?;
                (a, if a.is_ipv4() { 32 } else { 128 })
            }
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then_some(Cidr { net: addr, prefix })
    }

    /// Whether `ip` is in the network (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let bits = |a: IpAddr| -> u128 {
            match a {
                IpAddr::V4(v4) => u32::from(v4) as u128,
                IpAddr::V6(v6) => u128::from(v6),
            }
        };
        let width = if self.net.is_ipv4() { 32 } else { 128 };
        if ip.is_ipv4() != self.net.is_ipv4() {
            return false;
        }
        let shift = width - self.prefix as u32;
        shift >= width || (bits(ip) >> shift) == (bits(self.net) >> shift)
    }
}

/// Reads the PROXY header `peer` sends if it is on a `trusted` network, and returns the
/// client's address (the header's, or `peer` for a LOCAL/UNKNOWN header or an untrusted
/// peer). Only the header's bytes are taken from the socket.
pub(super) async fn read(
    socket: &TcpStream,
    peer: SocketAddr,
    trusted: &[Cidr],
    deadline: Instant,
) -> io::Result<SocketAddr> {
    if !trusted.iter().any(|n| n.contains(peer.ip())) {
        return Ok(peer);
    }
    let header = tokio::time::timeout_at(deadline, read_header(socket))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no PROXY header in time"))??;
    Ok(header.addresses.map_or(peer, |(client, _)| client))
}

/// The longest header: a v2 header's 16 bytes and the most its length field can say
/// (addresses and TLVs: AWS and GCP send theirs there).
const MAX_HEADER: usize = 16 + 65_535;

/// Takes a header off the socket as its bytes arrive (woken by readiness), never a byte
/// past its end: what has arrived is peeked at, and taken whole while the header goes on
/// beyond it (every byte of an unfinished header is the header's).
async fn read_header(socket: &TcpStream) -> io::Result<proxy_protocol::Header> {
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_owned());
    let mut got: Vec<u8> = Vec::new();
    let mut arrived = vec![0u8; 4096];
    loop {
        let n = socket.peek(&mut arrived).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let before = got.len();
        got.extend_from_slice(&arrived[..n]);
        match proxy_protocol::parse(&got).map_err(bad)? {
            Some(header) => {
                // parse wanted more at `before` bytes, so the header ends past them.
                let rest = header
                    .len
                    .checked_sub(before)
                    .ok_or_else(|| bad("PROXY header shorter than read"))?;
                take(socket, rest).await?;
                return Ok(header);
            }
            None if got.len() >= MAX_HEADER => return Err(bad("PROXY header too long")),
            None => take(socket, n).await?,
        }
    }
}

/// Reads and drops `n` bytes already peeked at.
async fn take(socket: &TcpStream, mut n: usize) -> io::Result<()> {
    let mut sink = [0u8; 4096];
    while n > 0 {
        socket.readable().await?;
        let want = n.min(sink.len());
        match socket.try_read(&mut sink[..want]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(read) => n -= read,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_contain_their_addresses() {
        let net = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(net.contains("10.200.3.4".parse().unwrap()));
        assert!(net.contains("::ffff:10.1.1.1".parse().unwrap()));
        assert!(!net.contains("11.0.0.1".parse().unwrap()));
        assert!(!net.contains("::1".parse().unwrap()));
        let one = Cidr::parse("127.0.0.1").unwrap();
        assert!(one.contains("127.0.0.1".parse().unwrap()));
        assert!(!one.contains("127.0.0.2".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
        assert!(Cidr::parse("2001:db8::/32")
            .unwrap()
            .contains("2001:db8:1::5".parse().unwrap()));
        for bad in ["10.0.0.0/33", "nope", "10.0.0.0/x", "::/129"] {
            assert!(Cidr::parse(bad).is_none(), "{bad}");
        }
    }
}
