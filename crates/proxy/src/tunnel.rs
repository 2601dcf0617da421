//! After an upgrade (HTTP/1.1 `101 Switching Protocols`, WebSocket's handshake), the
//! client's connection and the upstream's carry bytes both ways ([`crate::relay`]) until
//! both sides are done or nothing moves for the idle timeout. The bytes each side sent early (after
//! its head, before the switch) go first.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::pool::Conn;

/// An upgraded upstream connection waiting for the client's side, carried to the client
/// connection in the 101 response's extensions (which must be `Clone + Sync`: hence the
/// slot, taken once).
#[derive(Clone)]
pub struct Upgrade {
    conn: Arc<Mutex<Option<Conn>>>,
    /// The upstream's idle timeout.
    idle: Duration,
}

impl std::fmt::Debug for Upgrade {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Upgrade")
    }
}

impl Upgrade {
    pub(crate) fn new(conn: Conn, idle: Duration) -> Self {
        Upgrade {
            conn: Arc::new(Mutex::new(Some(conn))),
            idle,
        }
    }

    /// Carries bytes between `client` and the upstream until both directions have ended
    /// or nothing has moved for the upstream's idle timeout. `early` is what the client
    /// sent after its request head. Returns the bytes moved (to the upstream, to the
    /// client).
    pub async fn tunnel<C>(self, client: &mut C, early: &[u8]) -> io::Result<(u64, u64)>
    where
        C: AsyncRead + AsyncWrite + Unpin,
    {
        let idle = self.idle;
        let conn = self
            .conn
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| io::Error::other("the upgrade was already taken"))?;
        let Conn { read, write, buf } = conn;
        let mut upstream = read.unsplit(write);
        upstream.write_all(early).await?;
        upstream.flush().await?;
        client.write_all(&buf).await?;
        client.flush().await?;
        let (up, down, ended) = crate::relay::relay(client, upstream, idle).await;
        ended.map(|()| (up, down))
    }
}
