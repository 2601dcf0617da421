//! One client connection: TCP connect and TLS handshake (each timed), then requests over
//! HTTP/1.1 (our own small exchange) or HTTP/2 (hyper).
//!
//! With `--batch-kx` the rustls calls that compute key exchanges (creating the session:
//! the ClientHello's key share; processing the ServerHello: the shared secret) run on the
//! engine's coroutine bridge, as the server's handshake does, so that they wait for a
//! batch instead of computing one at a time.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, HandshakeKind, ProtocolVersion};
use terminus_engine::{Engine, HandshakeContext};
use terminus_tls::handshake::bridge;
use terminus_tls::{TlsStream, TrafficCounters};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

use crate::failure::Failure;
use crate::http1;
use crate::tls::Http;

/// Addresses taken in turn, as a round-robin balancer spreads new connections.
#[derive(Debug)]
pub struct Turns {
    addrs: Vec<SocketAddr>,
    next: std::sync::atomic::AtomicUsize,
}

impl Turns {
    /// `addrs` in turn, from the first.
    pub fn new(addrs: Vec<SocketAddr>) -> Self {
        assert!(!addrs.is_empty(), "at least one address");
        Self {
            addrs,
            next: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn next(&self) -> SocketAddr {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.addrs[i % self.addrs.len()]
    }
}

/// What every connection of a thread shares.
pub struct Endpoint {
    /// Where new connections go, each in turn (shared by every thread).
    pub addrs: Arc<Turns>,
    pub server_name: ServerName<'static>,
    pub config: Arc<ClientConfig>,
    /// The byte counters [`TlsStream`] keeps (the report does not show them).
    pub traffic: Arc<TrafficCounters>,
    /// HTTP/1.1 request bytes (keep-alive or close as the run asks).
    pub h1_request: Vec<u8>,
    /// HTTP/2 and HTTP/3 request parts.
    pub uri: hyper::Uri,
    pub http: Http,
    /// With [`Http::H3`]: the thread's QUIC client.
    pub h3: Option<crate::h3::Client>,
    /// False for an `http://` target: plain HTTP/1.1, no handshake.
    pub tls: bool,
    /// A simulated network round trip: every flight that answers the server waits this
    /// long first, as if the server's flight had taken that long to arrive and the
    /// answer to get back. Zero: loopback as it is.
    pub rtt: Duration,
}

/// An established connection, ready for requests.
pub struct Conn {
    io: Io,
    /// Requests sent on it so far.
    pub used: u64,
}

enum Io {
    H1 {
        stream: Box<TlsStream<ClientConnection>>,
        buf: Vec<u8>,
    },
    H2 {
        send: hyper::client::conn::http2::SendRequest<Empty<Bytes>>,
    },
    /// HTTP/1.1 without TLS.
    Plain {
        stream: TcpStream,
        buf: Vec<u8>,
    },
    H3(Box<crate::h3::Conn>),
}

/// What opening a connection measured.
pub struct Opened {
    pub conn: Conn,
    /// The TCP connect (none for QUIC).
    pub connect: Option<Duration>,
    pub handshake: Duration,
    pub resumed: bool,
    /// "TLSv1.3 TLS13_AES_256_GCM_SHA384 X25519".
    pub negotiated: String,
}

/// Why opening failed, with the connect time if the TCP part succeeded.
pub struct OpenFailed {
    pub failure: Failure,
    pub connect: Option<Duration>,
}

impl Endpoint {
    /// Connects and completes the TLS handshake (and the HTTP/2 preface) by `deadline`.
    /// `engine`: where key exchanges go with `--batch-kx`.
    pub async fn open(
        &self,
        deadline: Instant,
        engine: Option<&Engine>,
    ) -> Result<Opened, OpenFailed> {
        let failed = |failure, connect| OpenFailed { failure, connect };
        if let Some(client) = &self.h3 {
            let t0 = Instant::now();
            let name = self.server_name.to_str();
            return match timeout_at(deadline, client.open(self.addrs.next(), &name)).await {
                Ok(Ok(conn)) => Ok(Opened {
                    conn: Conn {
                        io: Io::H3(Box::new(conn)),
                        used: 0,
                    },
                    connect: None,
                    handshake: t0.elapsed(),
                    resumed: false,
                    negotiated: "HTTP/3 over QUIC (TLSv1.3)".into(),
                }),
                Ok(Err(failure)) => Err(failed(failure, None)),
                Err(_) => Err(failed(Failure::HandshakeTimeout, None)),
            };
        }
        let t0 = Instant::now();
        let mut tcp = match timeout_at(deadline, TcpStream::connect(self.addrs.next())).await {
            Ok(Ok(tcp)) => tcp,
            Ok(Err(e)) => return Err(failed(Failure::Connect(e), None)),
            Err(_) => return Err(failed(Failure::ConnectTimeout, None)),
        };
        let t1 = Instant::now();
        let connect = t1 - t0;
        // The client's Finished and the request must leave at once, not after an ACK.
        let _ = tcp.set_nodelay(true);
        if !self.tls {
            if self.http == Http::H2 {
                let why = "--http2 needs an https:// target".into();
                return Err(failed(Failure::Protocol(why), Some(connect)));
            }
            let io = Io::Plain {
                stream: tcp,
                buf: Vec::with_capacity(16 * 1024),
            };
            return Ok(Opened {
                conn: Conn { io, used: 0 },
                connect: Some(connect),
                handshake: Duration::ZERO,
                resumed: false,
                negotiated: "plain HTTP/1.1".into(),
            });
        }
        // The engine flushes a partial batch once every handshake in flight waits on it.
        let in_flight = engine.map(Engine::handshake_started);
        let (config, name) = (self.config.clone(), self.server_name.clone());
        let (session, waited) = match timeout_at(deadline, async {
            let session = on_bridge(engine, move || ClientConnection::new(config, name))
                .await
                .map_err(io::Error::other)?;
            handshake(&mut tcp, Box::new(session), engine, self.rtt).await
        })
        .await
        {
            Ok(Ok((session, waited))) => (*session, waited),
            Ok(Err(e)) => return Err(failed(Failure::Handshake(e), Some(connect))),
            Err(_) => return Err(failed(Failure::HandshakeTimeout, Some(connect))),
        };
        drop(in_flight);
        let handshake = t1.elapsed().saturating_sub(waited);
        let resumed = session.handshake_kind() == Some(HandshakeKind::Resumed);
        let negotiated = describe(&session);
        let h2 = session.alpn_protocol() == Some(b"h2");
        // The client's last flight (TLS 1.3: its Finished) is still queued in rustls: it
        // leaves with the first request, in one write.
        let tls = TlsStream::new(tcp, session, &[], self.traffic.clone())
            .map_err(|e| failed(Failure::Handshake(e), Some(connect)))?;
        let io = if self.http == Http::H2 {
            if !h2 {
                return Err(failed(
                    Failure::Protocol("the server did not negotiate h2 by ALPN".into()),
                    Some(connect),
                ));
            }
            let io = hyper_util::rt::TokioIo::new(tls);
            let handshake =
                hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io);
            let (send, driver) = match timeout_at(deadline, handshake).await {
                Ok(Ok(pair)) => pair,
                Ok(Err(e)) => return Err(failed(Failure::Protocol(e.to_string()), Some(connect))),
                Err(_) => return Err(failed(Failure::Timeout, Some(connect))),
            };
            tokio::task::spawn_local(async move {
                // Ends with the connection; its errors surface on the next request.
                let _ = driver.await;
            });
            Io::H2 { send }
        } else {
            Io::H1 {
                stream: Box::new(tls),
                buf: Vec::with_capacity(16 * 1024),
            }
        };
        Ok(Opened {
            conn: Conn { io, used: 0 },
            connect: Some(connect),
            handshake,
            resumed,
            negotiated,
        })
    }
}

impl Conn {
    /// Sends one GET and reads the whole response by `deadline`; returns the status and
    /// whether the connection can carry another request.
    pub async fn request(
        &mut self,
        endpoint: &Endpoint,
        deadline: Instant,
    ) -> Result<http1::Response, Failure> {
        self.used += 1;
        let exchange = async {
            match &mut self.io {
                Io::H1 { stream, buf } => {
                    http1::exchange(stream.as_mut(), &endpoint.h1_request, buf).await
                }
                Io::Plain { stream, buf } => {
                    http1::exchange(stream, &endpoint.h1_request, buf).await
                }
                Io::H3(conn) => conn.request(&endpoint.uri).await,
                Io::H2 { send } => {
                    send.ready().await.map_err(h2_failure)?;
                    let req = hyper::Request::get(endpoint.uri.clone())
                        .header("user-agent", "terminus-load")
                        .body(Empty::<Bytes>::new())
                        .map_err(|e| Failure::Protocol(e.to_string()))?;
                    let resp = send.send_request(req).await.map_err(h2_failure)?;
                    let status = resp.status().as_u16();
                    let mut body = resp.into_body();
                    while let Some(frame) = body.frame().await {
                        frame.map_err(|e| Failure::Protocol(e.to_string()))?;
                    }
                    Ok(http1::Response {
                        status,
                        reusable: !send.is_closed(),
                    })
                }
            }
        };
        timeout_at(deadline, exchange)
            .await
            .unwrap_or(Err(Failure::Timeout))
    }
}

/// Runs `f` on the engine's coroutine bridge, so the key exchanges rustls computes in it
/// are submitted to `engine`; without an engine, directly.
/// An HTTP/2 request's error: one the server did not process (a stream past its
/// graceful GOAWAY's last, a REFUSED_STREAM, or a request that never went because the
/// connection was closing) is [`Failure::Unprocessed`], which is sent again on a new
/// connection; any other is a protocol failure.
fn h2_failure(e: hyper::Error) -> Failure {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    let mut refused = e.is_canceled() || e.is_closed();
    while let Some(s) = source {
        if let Some(h2) = s.downcast_ref::<h2::Error>() {
            refused |= (h2.is_go_away() && h2.reason() == Some(h2::Reason::NO_ERROR))
                || h2.reason() == Some(h2::Reason::REFUSED_STREAM);
        }
        source = s.source();
    }
    match refused {
        true => Failure::Unprocessed(e.to_string()),
        false => Failure::Protocol(e.to_string()),
    }
}

async fn on_bridge<T: 'static>(engine: Option<&Engine>, f: impl FnOnce() -> T + 'static) -> T {
    match engine {
        Some(engine) => {
            let ctx = HandshakeContext::starting_now();
            bridge::run(f, |op| engine.submit(op, &ctx)).await
        }
        None => f(),
    }
}

/// Drives the handshake until rustls has the server's last flight. What the client must
/// still send (TLS 1.3: Finished) stays queued for the first request's write. Each flight
/// after the ClientHello waits `rtt` first; returns how long that was in all.
async fn handshake(
    tcp: &mut TcpStream,
    mut session: Box<ClientConnection>,
    engine: Option<&Engine>,
    rtt: Duration,
) -> io::Result<(Box<ClientConnection>, Duration)> {
    let mut waited = Duration::ZERO;
    let mut client_hello = true;
    loop {
        if session.wants_write() && !client_hello && !rtt.is_zero() {
            tokio::time::sleep(rtt).await;
            waited += rtt;
        }
        client_hello = false;
        while session.wants_write() {
            match session.write_tls(&mut SocketIo(tcp)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => tcp.writable().await?,
                Err(e) => return Err(e),
            }
        }
        match session.read_tls(&mut SocketIo(tcp)) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                tcp.readable().await?;
                continue;
            }
            Err(e) => return Err(e),
        }
        let (returned, processed) = on_bridge(engine, move || {
            let processed = session.process_new_packets().map(|_| ());
            (session, processed)
        })
        .await;
        session = returned;
        if let Err(e) = processed {
            // Tell the server why (the alert rustls queued), then give up.
            let _ = session.write_tls(&mut SocketIo(tcp));
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
        if !session.is_handshaking() {
            return Ok((session, waited));
        }
    }
}

/// The socket's non-blocking calls as the `Read`/`Write` rustls takes.
struct SocketIo<'a>(&'a TcpStream);

impl Read for SocketIo<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

impl Write for SocketIo<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn describe(session: &ClientConnection) -> String {
    let version = match session.protocol_version() {
        Some(ProtocolVersion::TLSv1_3) => "TLSv1.3".to_owned(),
        Some(ProtocolVersion::TLSv1_2) => "TLSv1.2".to_owned(),
        Some(other) => format!("{other:?}"),
        None => "?".to_owned(),
    };
    let suite = session
        .negotiated_cipher_suite()
        .and_then(|s| s.suite().as_str())
        .unwrap_or("?");
    let group = session
        .negotiated_key_exchange_group()
        .map(|g| format!("{:?}", g.name()))
        .unwrap_or_else(|| "-".to_owned());
    format!("{version} {suite} {group}")
}
