//! Connections that have not authenticated yet, on a listener whose peers must (the
//! keyless signer's mutual TLS): what strangers may hold of a worker before they show a
//! certificate. Whoever can reach the port can open connections and say nothing, so
//! they get a small budget of their own, apart from what authenticated peers use:
//!
//! - at most `limit` at once on a worker, so that strangers never hold what a
//!   terminator needs once it is known;
//! - at most `per_address` from one source address (an IPv6 address by its /64, as
//!   [`crate::clients::counted_address`] counts clients), so that one host cannot take
//!   the budget;
//! - when the budget is full, the newcomer takes the place of the oldest connection of
//!   the address that holds the most: hosts that open connections and wait hold the
//!   budget only as long as nobody new comes, and a host that churns connections to push
//!   others out evicts its own first. A lone peer's handshake is evicted only when every
//!   address holds one place, by connections from 64 addresses (/64s) at once.
//!
//! The admin listener holds its connections in such a budget too, for their whole
//! life: its peers never authenticate, and a scraper must find room while other hosts
//! hold idle connections.
//!
//! Policy without I/O: the caller closes what [`Admit::Yes`] says to evict and calls
//! [`Unauthenticated::done`] when a connection authenticates or ends.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

/// A connection's place in the table, as [`Unauthenticated::admit`] gave it.
pub type Ticket = u64;

/// What a newcomer gets.
#[derive(Debug, PartialEq, Eq)]
pub enum Admit {
    /// In, as `ticket`; if `evict` is set, that older connection's place was given to
    /// this one and the caller closes it.
    Yes {
        /// Its place, given back by [`Unauthenticated::done`].
        ticket: Ticket,
        /// The older connection whose place it took, for the caller to close.
        evict: Option<Ticket>,
    },
    /// Its address holds `per_address` already: close it.
    AddressFull,
}

/// One worker's unauthenticated connections (see the module's doc).
#[derive(Debug)]
pub struct Unauthenticated {
    limit: usize,
    per_address: usize,
    /// By ticket, so the first is the oldest.
    open: BTreeMap<Ticket, IpAddr>,
    by_address: HashMap<IpAddr, usize>,
    next: Ticket,
}

impl Unauthenticated {
    /// A table holding `limit` connections, `per_address` of them from one address
    /// (both at least 1).
    pub fn new(limit: usize, per_address: usize) -> Self {
        Unauthenticated {
            limit: limit.max(1),
            per_address: per_address.clamp(1, limit.max(1)),
            open: BTreeMap::new(),
            by_address: HashMap::new(),
            next: 0,
        }
    }

    /// A connection from `addr` asks to start its handshake.
    pub fn admit(&mut self, addr: IpAddr) -> Admit {
        let addr = crate::clients::counted_address(addr);
        if self.by_address.get(&addr).copied().unwrap_or(0) >= self.per_address {
            return Admit::AddressFull;
        }
        let evict = if self.open.len() >= self.limit {
            self.victim()
        } else {
            None
        };
        if let Some(old) = evict {
            self.done(old);
        }
        let ticket = self.next;
        self.next += 1;
        self.open.insert(ticket, addr);
        *self.by_address.entry(addr).or_insert(0) += 1;
        Admit::Yes { ticket, evict }
    }

    /// The oldest connection of the address holding the most (the oldest of all among
    /// equals). The table is small (its `limit`): a scan costs less than an index.
    fn victim(&self) -> Option<Ticket> {
        let most = self.by_address.values().copied().max()?;
        self.open
            .iter()
            .find(|(_, a)| self.by_address.get(a) == Some(&most))
            .map(|(&t, _)| t)
    }

    /// `ticket`'s connection authenticated, or ended; nothing if it was evicted already.
    pub fn done(&mut self, ticket: Ticket) {
        let Some(addr) = self.open.remove(&ticket) else {
            return;
        };
        if let Some(n) = self.by_address.get_mut(&addr) {
            *n -= 1;
            if *n == 0 {
                self.by_address.remove(&addr);
            }
        }
    }

    /// How many are open.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    fn ticket(a: Admit) -> (Ticket, Option<Ticket>) {
        match a {
            Admit::Yes { ticket, evict } => (ticket, evict),
            Admit::AddressFull => panic!("refused"),
        }
    }

    #[test]
    fn one_address_holds_at_most_its_share_and_others_still_get_in() {
        let mut t = Unauthenticated::new(16, 4);
        for _ in 0..4 {
            ticket(t.admit(ip(1)));
        }
        for _ in 0..1000 {
            assert_eq!(t.admit(ip(1)), Admit::AddressFull);
        }
        assert_eq!(t.len(), 4);
        let (_, evict) = ticket(t.admit(ip(2)));
        assert_eq!(evict, None);
    }

    #[test]
    fn a_full_table_gives_the_oldest_place_to_the_newcomer() {
        let mut t = Unauthenticated::new(3, 3);
        let (a, _) = ticket(t.admit(ip(1)));
        let (b, _) = ticket(t.admit(ip(2)));
        ticket(t.admit(ip(3)));
        let (_, evict) = ticket(t.admit(ip(4)));
        assert_eq!(evict, Some(a));
        assert_eq!(t.len(), 3);
        // The evicted one's address has its place back.
        let (_, evict) = ticket(t.admit(ip(1)));
        assert_eq!(evict, Some(b));
        // Its own `done`, when its task ends, changes nothing.
        t.done(a);
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn a_host_that_churns_connections_evicts_its_own_before_a_lone_peers() {
        let mut t = Unauthenticated::new(8, 4);
        let (lone, _) = ticket(t.admit(ip(9)));
        for i in 0..1000 {
            let (_, evict) = ticket(t.admit(ip(1 + (i % 3) as u8)));
            assert_ne!(evict, Some(lone), "newcomer {i} evicted the lone peer");
        }
    }

    #[test]
    fn an_ipv6_host_is_counted_by_its_64() {
        let mut t = Unauthenticated::new(16, 2);
        let in_64 = |low: u16| IpAddr::from([0x2001, 0xdb8, 0, 1, 0, 0, 0, low]);
        ticket(t.admit(in_64(1)));
        ticket(t.admit(in_64(2)));
        assert_eq!(t.admit(in_64(3)), Admit::AddressFull);
    }

    #[test]
    fn done_frees_the_address_and_the_table() {
        let mut t = Unauthenticated::new(4, 1);
        let (a, _) = ticket(t.admit(ip(1)));
        assert_eq!(t.admit(ip(1)), Admit::AddressFull);
        t.done(a);
        t.done(a);
        assert!(t.is_empty());
        ticket(t.admit(ip(1)));
    }
}
