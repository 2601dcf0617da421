//! A plain-HTTP listener's connection (`plain = "redirect"`): no handshake, so nothing
//! for admission control to weigh; HTTP/1.1 answered by [`crate::app::redirect`] (ACME
//! HTTP-01 challenges, then a redirect to HTTPS).

use std::net::SocketAddr;
use std::rc::Rc;

use tokio::net::TcpStream;

use crate::admission::Ticket;
use crate::app::redirect::Redirect;
use crate::worker::{OpenConnection, Worker};
use terminus_config::Listen;

/// Serves one plain connection to its end.
pub(super) async fn run(
    socket: TcpStream,
    peer: SocketAddr,
    mut open: OpenConnection,
    admitted: Ticket,
    listen: &Listen,
    worker: Rc<Worker>,
) {
    admitted.cancel();
    let Some(peer) = super::client_address(&socket, peer, listen, &worker).await else {
        return;
    };
    if !open.count_client(peer.ip(), &worker.shared.site.current()) {
        return super::too_many_connections(&socket, peer);
    }
    let _ = socket.set_nodelay(true);
    let site = worker.shared.site.current();
    let timeouts = site.timeouts.http;
    let responder = Redirect {
        site,
        peer,
        https_port: worker.shared.https_port,
        challenges: worker.shared.challenges.clone(),
        metrics: worker.shared.metrics.clone(),
    };
    terminus_http::serve_plain(socket, &responder, timeouts, worker.shared.shutdown.clone()).await;
}
