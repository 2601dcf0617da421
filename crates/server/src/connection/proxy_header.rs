//! A PROXY protocol header (v1 or v2) in front of the TLS bytes, from an L4 load balancer
//! on a `trusted` network: read before the ClientHello, without taking any byte past it,
//! and the client's address taken from it. A connection from elsewhere is served as it
//! is (a header from an untrusted peer is just bytes that fail the handshake).

use std::io;
use std::net::SocketAddr;

use terminus_config::Cidr;
use terminus_proxy::proxy_protocol;
use tokio::net::TcpStream;
use tokio::time::Instant;

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
