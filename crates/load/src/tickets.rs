//! The client's session store for `--resume`: a ticket for every connection in flight.
//!
//! rustls's in-memory store keeps eight TLS 1.3 tickets per server, as much as a browser
//! needs. A load with a hundred connections to one server takes tickets faster than that
//! in bursts: a connection's two tickets arrive with its answer, while the connections
//! that start meanwhile each take one. With eight kept, a burst of completions overflows
//! the store and the next burst of starts finds it empty, so about a fifth of the
//! handshakes went out without a ticket: the resumed share then measured the client, not
//! the server (76-82% for terminus where nginx, answering less in step, got 99%). TLS 1.2
//! sessions and key-exchange hints stay in rustls's store: one session per server is
//! offered by every connection at once.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use rustls::client::{
    ClientSessionMemoryCache, ClientSessionStore, Tls12ClientSessionValue, Tls13ClientSessionValue,
};
use rustls::pki_types::ServerName;
use rustls::NamedGroup;

/// TLS 1.3 tickets kept per server: two for each of 2,048 connections.
const TICKETS_PER_SERVER: usize = 4096;

/// Up to [`TICKETS_PER_SERVER`] TLS 1.3 tickets per server, the newest used first.
#[derive(Debug)]
pub struct TicketStore {
    tls13: Mutex<HashMap<ServerName<'static>, VecDeque<Tls13ClientSessionValue>>>,
    rest: ClientSessionMemoryCache,
}

impl TicketStore {
    pub fn new() -> Self {
        Self {
            tls13: Mutex::default(),
            rest: ClientSessionMemoryCache::new(256),
        }
    }
}

impl ClientSessionStore for TicketStore {
    fn set_kx_hint(&self, server: ServerName<'static>, group: NamedGroup) {
        self.rest.set_kx_hint(server, group);
    }

    fn kx_hint(&self, server: &ServerName<'_>) -> Option<NamedGroup> {
        self.rest.kx_hint(server)
    }

    fn set_tls12_session(&self, server: ServerName<'static>, value: Tls12ClientSessionValue) {
        self.rest.set_tls12_session(server, value);
    }

    fn tls12_session(&self, server: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.rest.tls12_session(server)
    }

    fn remove_tls12_session(&self, server: &ServerName<'static>) {
        self.rest.remove_tls12_session(server);
    }

    fn insert_tls13_ticket(&self, server: ServerName<'static>, value: Tls13ClientSessionValue) {
        let mut all = self.tls13.lock().expect("ticket store lock");
        let kept = all.entry(server).or_default();
        if kept.len() == TICKETS_PER_SERVER {
            kept.pop_front();
        }
        kept.push_back(value);
    }

    fn take_tls13_ticket(&self, server: &ServerName<'static>) -> Option<Tls13ClientSessionValue> {
        self.tls13
            .lock()
            .expect("ticket store lock")
            .get_mut(server)
            .and_then(VecDeque::pop_back)
    }
}
