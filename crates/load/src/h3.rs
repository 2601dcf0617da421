//! HTTP/3 connections for `--http3`: QUIC by quinn, HTTP/3 by the `h3` crate.
//!
//! A thread's connections share a few quinn endpoints (UDP sockets), taken in turn: a
//! server whose workers share the port by `SO_REUSEPORT` sees several client addresses,
//! as from several browsers, instead of one flow that the kernel gives to one worker.
//! QUIC has no separate connect: the handshake's time is from the first Initial to the
//! handshake's completion (the client's 1-RTT keys).

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use quinn::crypto::rustls::QuicClientConfig;
use rustls::ClientConfig;

use crate::failure::Failure;
use crate::http1::Response;
use crate::LoadError;

/// UDP sockets per thread at most.
const SOCKETS: usize = 16;

/// What a thread's HTTP/3 connections share.
pub struct Client {
    config: quinn::ClientConfig,
    /// Opened on first use (quinn needs the thread's runtime), then taken in turn.
    endpoints: RefCell<(Vec<quinn::Endpoint>, usize)>,
}

impl Client {
    /// A client speaking HTTP/3 with `tls` (whose ALPN must be `h3`); fails if it cannot
    /// do QUIC (no TLS 1.3, or no suite QUIC's Initial packets use).
    pub fn new(tls: Arc<ClientConfig>) -> Result<Self, LoadError> {
        let quic = QuicClientConfig::try_from(tls).map_err(LoadError::Quic)?;
        let mut config = quinn::ClientConfig::new(Arc::new(quic));
        let mut transport = quinn::TransportConfig::default();
        // A benchmark's connections idle only between its requests.
        transport.max_idle_timeout(Some(Duration::from_secs(30).try_into().expect("30 s")));
        config.transport_config(Arc::new(transport));
        Ok(Self {
            config,
            endpoints: RefCell::new((Vec::new(), 0)),
        })
    }

    fn endpoint(&self, server: SocketAddr) -> std::io::Result<quinn::Endpoint> {
        let mut endpoints = self.endpoints.borrow_mut();
        let (list, next) = &mut *endpoints;
        *next += 1;
        if list.len() < SOCKETS {
            let local: SocketAddr = if server.is_ipv6() {
                "[::]:0".parse().expect("address")
            } else {
                "0.0.0.0:0".parse().expect("address")
            };
            let socket = std::net::UdpSocket::bind(local)?;
            // As the server's: a burst of handshakes' datagrams must not be dropped
            // while this thread is busy (a lost Initial costs a second).
            let _ = terminus_sys::set_socket_buffers(&socket, 4 << 20);
            let mut endpoint = quinn::Endpoint::new(
                quinn::EndpointConfig::default(),
                None,
                socket,
                Arc::new(quinn::TokioRuntime),
            )?;
            endpoint.set_default_client_config(self.config.clone());
            list.push(endpoint);
        }
        Ok(list[*next % list.len()].clone())
    }

    /// Opens a connection to `server` (named `name` in SNI) and starts its HTTP/3
    /// session.
    pub async fn open(&self, server: SocketAddr, name: &str) -> Result<Conn, Failure> {
        let endpoint = self.endpoint(server).map_err(Failure::Connect)?;
        let connecting = endpoint
            .connect(server, name)
            .map_err(|e| Failure::Protocol(format!("QUIC: {e}")))?;
        let quic = connecting
            .await
            .map_err(|e| Failure::Handshake(std::io::Error::other(e)))?;
        let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(quic.clone()))
            .await
            .map_err(|e| Failure::Protocol(format!("HTTP/3: {e}")))?;
        tokio::task::spawn_local(async move {
            // Ends with the connection; its errors surface on the next request.
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        Ok(Conn { send, quic })
    }
}

/// An HTTP/3 connection, closed with H3_NO_ERROR when dropped.
pub struct Conn {
    send: h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    quic: quinn::Connection,
}

impl Conn {
    /// Sends one GET of `uri` and reads the whole response.
    pub async fn request(&mut self, uri: &hyper::Uri) -> Result<Response, Failure> {
        let protocol = |e: &dyn std::fmt::Display| Failure::Protocol(format!("HTTP/3: {e}"));
        let request = hyper::Request::get(uri.clone())
            .header("user-agent", "terminus-load")
            .body(())
            .map_err(|e| protocol(&e))?;
        let mut stream = self
            .send
            .send_request(request)
            .await
            .map_err(|e| protocol(&e))?;
        stream.finish().await.map_err(|e| protocol(&e))?;
        let response = stream.recv_response().await.map_err(|e| protocol(&e))?;
        while let Some(mut data) = stream.recv_data().await.map_err(|e| protocol(&e))? {
            data.advance(data.remaining());
        }
        Ok(Response {
            status: response.status().as_u16(),
            reusable: self.quic.close_reason().is_none(),
        })
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let code = h3::error::Code::H3_NO_ERROR.value();
        self.quic
            .close(quinn::VarInt::from_u64(code).unwrap_or_default(), b"");
    }
}
