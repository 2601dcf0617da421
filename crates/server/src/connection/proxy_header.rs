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
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_owned());
    let mut probe = [0u8; 232]; // the longest v1 line and a v2 header with IPv6 addresses fit
    let header = loop {
        let n = tokio::time::timeout_at(deadline, socket.peek(&mut probe))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no PROXY header in time"))??;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        match proxy_protocol::parse(&probe[..n]).map_err(bad)? {
            Some(header) => break header,
            None if n == probe.len() => return Err(bad("PROXY header too long")),
            // Part of it: wait for more (peek returns at once while bytes are there).
            None => tokio::time::sleep(std::time::Duration::from_millis(1)).await,
        }
    };
    let mut taken = vec![0u8; header.len];
    let mut got = 0;
    while got < header.len {
        socket.readable().await?;
        match socket.try_read(&mut taken[got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(header.addresses.map_or(peer, |(client, _)| client))
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
