//! What a proxy leaves on a response for the connection that sends it: which server
//! answered ([`Upstreamed`]), and, for a `101` or an accepted extended CONNECT, the
//! upstream connection to carry bytes to and from ([`Upgrade`]). The connection knows
//! neither how the proxy reached the server nor how it relays: the proxy gives a
//! [`Tunnel`], the connection gives its client side.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncWrite};

/// Which server answered a proxied response (a response extension): for the access log,
/// and to tell an upstream's `400` from terminus's own refusal of a malformed request.
#[derive(Debug, Clone, Copy)]
pub struct Upstreamed {
    /// The server's address.
    pub server: std::net::SocketAddr,
    /// Its status code.
    pub status: u16,
    /// From the end of the request head to the response head.
    pub header_time: std::time::Duration,
}

/// The client's side of a tunnel: the connection, or an HTTP/2 stream's data.
pub trait ClientIo: AsyncRead + AsyncWrite + Unpin {}

impl<T: AsyncRead + AsyncWrite + Unpin + ?Sized> ClientIo for T {}

/// A tunnel's run: the bytes moved (to the upstream, to the client), or why it ended.
pub type Tunnelling<'a> = Pin<Box<dyn Future<Output = io::Result<(u64, u64)>> + 'a>>;

/// A relay the proxy set up and the connection runs once the answer is sent.
pub trait Tunnel: Send {
    /// Carries bytes between `client` and the upstream until both directions have ended
    /// or nothing moves for the upstream's idle timeout. `early` is what the client sent
    /// after its request head. Returns the bytes moved (to the upstream, to the client).
    fn run<'a>(self: Box<Self>, client: &'a mut dyn ClientIo, early: &'a [u8]) -> Tunnelling<'a>;
}

/// An upgraded upstream connection waiting for the client's side, carried in the
/// response's extensions (which must be `Clone + Sync`: hence the slot, taken once).
#[derive(Clone)]
pub struct Upgrade(Arc<Mutex<Option<Box<dyn Tunnel>>>>);

impl std::fmt::Debug for Upgrade {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Upgrade")
    }
}

impl Upgrade {
    /// An upgrade that runs `tunnel`.
    pub fn new(tunnel: impl Tunnel + 'static) -> Self {
        Upgrade(Arc::new(Mutex::new(Some(Box::new(tunnel)))))
    }

    /// Runs the tunnel between `client` and the upstream (see [`Tunnel::run`]).
    pub async fn tunnel<C: ClientIo>(self, client: &mut C, early: &[u8]) -> io::Result<(u64, u64)> {
        let tunnel = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| io::Error::other("the upgrade was already taken"))?;
        tunnel.run(client, early).await
    }
}
