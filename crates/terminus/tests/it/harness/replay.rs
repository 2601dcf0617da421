//! A rustls client that offers a session another server issued: its TLS 1.2 ticket is
//! junk to the server under test, which cannot decrypt it and must run (and charge, and
//! admit) a full handshake. What a flood of fake resumptions looks like on the wire.

use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::client::{ClientSessionStore, Tls12ClientSessionValue, Tls13ClientSessionValue};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, NamedGroup};
use terminus_load::{tls::client_config, TlsChoice, Trust};

use super::Server;

/// Keeps the TLS 1.2 session of the first server it saw and offers it to every server.
#[derive(Debug, Default)]
struct Replaying(Mutex<Option<Tls12ClientSessionValue>>);

impl ClientSessionStore for Replaying {
    fn set_kx_hint(&self, _: ServerName<'static>, _: NamedGroup) {}
    fn kx_hint(&self, _: &ServerName<'_>) -> Option<NamedGroup> {
        None
    }
    fn set_tls12_session(&self, _: ServerName<'static>, value: Tls12ClientSessionValue) {
        self.0.lock().unwrap().get_or_insert(value);
    }
    fn tls12_session(&self, _: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.0.lock().unwrap().clone()
    }
    fn remove_tls12_session(&self, _: &ServerName<'static>) {}
    fn insert_tls13_ticket(&self, _: ServerName<'static>, _: Tls13ClientSessionValue) {}
    fn take_tls13_ticket(&self, _: &ServerName<'static>) -> Option<Tls13ClientSessionValue> {
        None
    }
}

/// How one handshake ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Completed, and resumed.
    Resumed,
    /// Completed in full.
    Full,
    /// Refused or failed (an alert, a reset).
    Refused,
}

/// A TLS 1.2 client, offering a foreign session or none.
pub struct Client {
    config: Arc<ClientConfig>,
    store: Option<Arc<Replaying>>,
}

impl Client {
    /// A client that offers every server the session `issuer` gave it for `name`.
    pub fn with_session_of(issuer: &Server, name: &str) -> Client {
        let mut config = (*client_config(&TlsChoice {
            trust: Trust::Insecure,
            versions: vec!["1.2".into()],
            ..TlsChoice::default()
        })
        .unwrap())
        .clone();
        let store = Arc::new(Replaying::default());
        config.resumption = rustls::client::Resumption::store(store.clone());
        let client = Client {
            config: Arc::new(config),
            store: Some(store),
        };
        assert_ne!(
            client.handshake(issuer, name),
            Outcome::Refused,
            "{name} at the issuer"
        );
        assert!(
            client.holds_a_session(),
            "the issuer gave no TLS 1.2 session"
        );
        client
    }

    /// A TLS 1.2 client that offers no session.
    pub fn plain() -> Client {
        Client {
            config: client_config(&TlsChoice {
                trust: Trust::Insecure,
                versions: vec!["1.2".into()],
                ..TlsChoice::default()
            })
            .unwrap(),
            store: None,
        }
    }

    fn holds_a_session(&self) -> bool {
        self.store
            .as_ref()
            .is_some_and(|s| s.0.lock().unwrap().is_some())
    }

    /// One handshake with `server` for `name`, SNI included.
    pub fn handshake(&self, server: &Server, name: &str) -> Outcome {
        let name = ServerName::try_from(name.to_owned()).unwrap();
        let mut conn = ClientConnection::new(self.config.clone(), name).unwrap();
        let Ok(mut tcp) = TcpStream::connect(server.addr) else {
            return Outcome::Refused;
        };
        tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        while conn.is_handshaking() {
            if conn.complete_io(&mut tcp).is_err() {
                return Outcome::Refused;
            }
        }
        match conn.handshake_kind() {
            Some(rustls::HandshakeKind::Resumed) => Outcome::Resumed,
            _ => Outcome::Full,
        }
    }
}
