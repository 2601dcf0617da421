//! A TLS client that writes exactly the bytes a test gives it, when it gives them: for
//! what curl and s_client will not send (dribbled headers, smuggling attempts, pipelined
//! requests in one write) and for timing when the server closes.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::{ClientConnection, StreamOwned};
use terminus_load::{tls::client_config, TlsChoice, Trust};

use super::Server;

/// How a read ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The server closed (close_notify, FIN or reset).
    Closed,
    /// Still open when the time given ran out.
    Open,
}

/// One HTTP/1.1-over-TLS connection to a test server, handshake done.
pub struct Raw {
    tls: StreamOwned<ClientConnection, TcpStream>,
}

impl Raw {
    pub fn connect(server: &Server) -> Raw {
        Raw::connect_as(server, Some("localhost"))
    }

    /// A connection whose ClientHello names `sni` (None: no server_name extension, as
    /// a client that connects to an IP address sends).
    pub fn connect_as(server: &Server, sni: Option<&str>) -> Raw {
        // The load generator's client: the test servers' certificates are self-signed,
        // so trust is not checked, the handshake signature still is.
        let config = client_config(&TlsChoice {
            trust: Trust::Insecure,
            ..TlsChoice::default()
        })
        .unwrap();
        // rustls sends no SNI for an IP address.
        let name = match sni {
            Some(name) => ServerName::try_from(name.to_owned()).unwrap(),
            None => ServerName::IpAddress(server.addr.ip().into()),
        };
        let conn = ClientConnection::new(config, name).unwrap();
        let tcp = TcpStream::connect(server.addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut tls = StreamOwned::new(conn, tcp);
        while tls.conn.is_handshaking() {
            tls.conn
                .complete_io(&mut tls.sock)
                .unwrap_or_else(|e| panic!("handshake with {}: {e}", server.addr));
        }
        Raw { tls }
    }

    /// Writes `bytes` in one TLS record and flushes them to the socket.
    pub fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.tls.write_all(bytes)?;
        self.tls.flush()
    }

    /// Reads whatever arrives for up to `within`; stops early if the server closes.
    pub fn read_for(&mut self, within: Duration) -> (Vec<u8>, Ended) {
        let deadline = Instant::now() + within;
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return (got, Ended::Open);
            }
            self.tls.sock.set_read_timeout(Some(left)).unwrap();
            match self.tls.read(&mut buf) {
                Ok(0) => return (got, Ended::Closed),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return (got, Ended::Open)
                }
                Err(_) => return (got, Ended::Closed),
            }
        }
    }

    /// One read: what the first record(s) to arrive hold.
    pub fn read_some(&mut self) -> Vec<u8> {
        self.tls
            .sock
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut buf = vec![0u8; 16384];
        let n = self.tls.read(&mut buf).expect("a reply");
        buf.truncate(n);
        buf
    }

    /// Reads until the server closes, for at most `within` (a test failure after that).
    pub fn read_to_close(&mut self, within: Duration) -> Vec<u8> {
        let (got, ended) = self.read_for(within);
        assert_eq!(
            ended,
            Ended::Closed,
            "server still open after {within:?}; it sent {:?}",
            String::from_utf8_lossy(&got)
        );
        got
    }
}

/// The status codes of every response in `reply`, in order.
pub fn statuses(reply: &[u8]) -> Vec<u16> {
    let text = String::from_utf8_lossy(reply);
    text.match_indices("HTTP/1.1 ")
        .filter_map(|(at, _)| text[at + 9..].get(..3)?.parse().ok())
        .collect()
}
