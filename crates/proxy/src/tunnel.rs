//! After an upgrade (HTTP/1.1 `101 Switching Protocols`, WebSocket's handshake), the
//! client's connection and the upstream's carry bytes both ways ([`crate::relay`]) until
//! both sides are done or nothing moves for the idle timeout. The bytes each side sent early (after
//! its head, before the switch) go first.

use std::time::Duration;

use terminus_http::upstream::{ClientIo, Tunnel, Tunnelling};
use terminus_http::Upgrade;
use tokio::io::AsyncWriteExt;

use crate::pool::Conn;

/// The upgrade a `101` carries: `conn`, relayed until both sides are done or nothing
/// moves for `idle` (the upstream's idle timeout).
pub(crate) fn upgrade(conn: Conn, idle: Duration) -> Upgrade {
    Upgrade::new(Upgraded { conn, idle })
}

/// An upgraded upstream connection waiting for the client's side.
struct Upgraded {
    conn: Conn,
    idle: Duration,
}

impl Tunnel for Upgraded {
    fn run<'a>(self: Box<Self>, client: &'a mut dyn ClientIo, early: &'a [u8]) -> Tunnelling<'a> {
        Box::pin(async move {
            let Upgraded { conn, idle } = *self;
            let Conn { read, write, buf } = conn;
            let mut upstream = read.unsplit(write);
            upstream.write_all(early).await?;
            upstream.flush().await?;
            client.write_all(&buf).await?;
            client.flush().await?;
            let (up, down, ended) = crate::relay::relay(client, upstream, idle).await;
            ended.map(|()| (up, down))
        })
    }
}
