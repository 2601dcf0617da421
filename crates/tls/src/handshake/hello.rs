//! The hello stage: the ClientHello read and parsed before any handshake state exists.
//!
//! rustls's [`Acceptor`] parses the ClientHello without choosing a configuration, so the
//! caller learns the server name (and with it the virtual host, the tenant and the route)
//! before a byte of the handshake is answered or any crypto is asked for.

use rustls::server::{Accepted, Acceptor, ClientHello};
use terminus_engine::{Engine, HandshakeGuard};
use tokio::net::TcpStream;

use super::driver::{receive, write_all};
use super::HandshakeError;
use crate::record::whole_records;
use crate::stream::TrafficCounters;

/// A connection whose ClientHello has been read: the input of [`super::handshake`].
pub struct ClientHelloRead {
    pub(super) accepted: Accepted,
    /// Bytes after the last whole record given to rustls.
    pub(super) received: Vec<u8>,
    /// Counts the connection as a handshake in flight from its first byte: until its
    /// ClientHello is read it may still add crypto requests, so batches wait for it.
    pub(super) _in_flight: HandshakeGuard,
}

impl ClientHelloRead {
    pub fn client_hello(&self) -> ClientHello<'_> {
        self.accepted.client_hello()
    }
}

/// Reads records from `stream` until rustls has a whole ClientHello. A malformed one is
/// answered with the alert rustls chose before the error is returned.
pub async fn read_client_hello(
    stream: &TcpStream,
    engine: &Engine,
    counters: &TrafficCounters,
) -> Result<ClientHelloRead, HandshakeError> {
    let in_flight = engine.handshake_started();
    let mut acceptor = Acceptor::default();
    let mut received = Vec::with_capacity(4096);
    loop {
        let whole = whole_records(&received);
        if whole == 0 {
            let n = receive(&mut received, stream).await?;
            if n == 0 {
                return Err(HandshakeError::Eof);
            }
            counters.add_in(n);
            continue;
        }
        let mut rest = &received[..whole];
        while !rest.is_empty() {
            if acceptor.read_tls(&mut rest)? == 0 {
                break;
            }
        }
        let fed = whole - rest.len();
        received.drain(..fed);
        match acceptor.accept() {
            Ok(Some(accepted)) => {
                return Ok(ClientHelloRead {
                    accepted,
                    received,
                    _in_flight: in_flight,
                })
            }
            Ok(None) => {}
            Err((e, mut alert)) => {
                let mut out = Vec::new();
                alert.write_all(&mut out)?;
                counters.add_out(out.len());
                let _ = write_all(stream, &out).await;
                return Err(e.into());
            }
        }
    }
}
