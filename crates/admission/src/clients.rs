//! Per-client limits, policy without I/O: how many requests a client may make (a rate
//! with a burst, nginx's `limit_req ... nodelay`) and how many connections it may hold
//! open at once (nginx's `limit_conn`). The server asks [`Clients`] for each request and
//! each connection; one `Clients` serves every worker, so a limit is exact per instance
//! whichever worker a client's connections land on.
//!
//! A client is its address ([`counted_address`]: IPv4 whole, IPv6 by its /64, as one
//! host's or one customer's network usually is) or a key the server read from its
//! request (an API key's header).
//!
//! **Rates** are kept by a [`Meter`] (GCRA) per client in a [`RateTable`] of a fixed
//! number of entries, so that a flood of new addresses cannot grow it: a new client takes
//! the entry of its set that owes least (an empty one, else one whose meter is back to
//! full credit, which holds nothing a new meter would not, else the one nearest to it),
//! so what a full table forgets costs the least. Requests within the burst pass at once,
//! beyond it they are refused with the time until one would pass (nothing is delayed).
//!
//! **Connections** are counted per address in [`Connections`], an entry only while the
//! address has one open: its size is bounded by the open connections themselves.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use terminus_metrics::{Counter, Exposition, Kind, Labels, Render};

use crate::meter::Meter;

/// Whose requests a rate counts together.
#[derive(Debug, Clone, Copy)]
pub enum Client<'a> {
    /// A client address (counted as [`counted_address`] says).
    Address(IpAddr),
    /// A key read from the request, such as an API key's header value.
    Key(&'a [u8]),
}

/// The address a client is counted by: an IPv4 address as it is (an IPv4-mapped IPv6
/// address as its IPv4), an IPv6 address by its /64 (one host or one site: a host given
/// a /64 has 2^64 addresses to spread its requests over).
pub fn counted_address(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !(u64::MAX as u128))),
        v4 => v4,
    }
}

/// A request rate with a burst: `requests` per `per`, and `burst` requests beyond it at
/// once (nginx's `rate` and `burst` with `nodelay`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    per_second: f64,
    burst: u32,
}

impl Rate {
    /// `requests` per `per` (both above zero), `burst` more at once.
    pub fn new(requests: u32, per: Duration, burst: u32) -> Self {
        Self {
            per_second: f64::from(requests.max(1)) / per.as_secs_f64().max(1e-6),
            burst,
        }
    }

    /// A new client's meter: `burst` requests of tolerance.
    fn meter(self) -> Meter {
        Meter::new(self.per_second, f64::from(self.burst) / self.per_second)
    }
}

/// What a rate says of one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// Within the rate or the burst: it goes on, counted.
    Pass,
    /// Beyond the burst: refused, not counted. One would pass after `retry_after`.
    Refuse {
        /// How long until a request would pass.
        retry_after: Duration,
    },
}

/// How many entries a set holds: a new client evicts within its set (as a CPU cache
/// does), so finding an entry to evict looks at this many, whatever the table's size.
const WAYS: usize = 8;
/// The most shards (each its own lock): enough that workers rarely meet on one.
const MAX_SHARDS: usize = 64;

/// One client's meter, under the hash of its zone and key (0: empty).
#[derive(Debug, Clone, Copy)]
struct Slot {
    key: u64,
    meter: Meter,
}

impl Slot {
    const EMPTY: Slot = Slot {
        key: 0,
        meter: Meter::new(1.0, 0.0),
    };

    /// Which entry of a set a new client takes: the lowest (empty, then the meter that
    /// is due first: one due in the past owes nothing).
    fn rank(&self) -> f64 {
        if self.key == 0 {
            f64::NEG_INFINITY
        } else {
            self.meter.due()
        }
    }
}

/// Every client's rate meter, in a fixed number of entries shared by the workers: shards
/// behind their own locks, each a fixed array of sets of [`WAYS`] entries, allocated when
/// first used. A client is found by a keyed hash (SipHash, keys chosen at start, so a
/// client cannot choose whom it shares a set with) of its zone (which rate: a server's or
/// a route's) and its key; two clients whose 64-bit hashes are equal would share a meter.
#[derive(Debug)]
pub struct RateTable {
    shards: Box<[Mutex<Vec<Slot>>]>,
    /// Sets per shard.
    sets: usize,
    hasher: RandomState,
    /// The meters' clock: seconds since.
    epoch: Instant,
    /// Entries in use.
    held: AtomicUsize,
    /// Entries taken from a client that still owed (the table was full of clients that
    /// owed more).
    forgiven: Counter,
}

impl RateTable {
    /// A table of at least `capacity` entries (rounded up to whole sets in every shard).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(WAYS);
        let shards = (capacity / (WAYS * 4)).clamp(1, MAX_SHARDS);
        // A power of two, so a shard is picked by the hash's low bits.
        let shards = 1 << (usize::BITS - 1 - shards.leading_zeros());
        let sets = capacity.div_ceil(shards * WAYS);
        Self {
            shards: (0..shards).map(|_| Mutex::new(Vec::new())).collect(),
            sets,
            hasher: RandomState::new(),
            epoch: Instant::now(),
            held: AtomicUsize::new(0),
            forgiven: Counter::new(
                "terminus_rate_keys_forgiven_total",
                "Rate keys dropped to make room while they still owed: a full table (limits.rate_keys) forgave them the rest.",
            ),
        }
    }

    /// How many clients it holds at most.
    pub fn capacity(&self) -> usize {
        self.shards.len() * self.sets * WAYS
    }

    /// How many it holds now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Counts a request of `client` against `rate` in `zone`, now.
    pub fn check(&self, zone: u64, client: Client<'_>, rate: Rate) -> Verdict {
        self.check_at(zone, client, rate, self.epoch.elapsed().as_secs_f64())
    }

    /// [`RateTable::check`] at `now`, seconds on the table's clock.
    fn check_at(&self, zone: u64, client: Client<'_>, rate: Rate, now: f64) -> Verdict {
        let hash = self.hash(zone, client);
        let key = hash.max(1);
        let set = (hash >> 32) as usize % self.sets;
        let mut slots = self.shard(hash);
        if slots.is_empty() {
            slots.resize(self.sets * WAYS, Slot::EMPTY);
        }
        let ways = &mut slots[set * WAYS..][..WAYS];
        let slot = match ways.iter().position(|s| s.key == key) {
            Some(i) => &mut ways[i],
            None => {
                let victim = ways
                    .iter_mut()
                    .min_by(|a, b| a.rank().total_cmp(&b.rank()))
                    .expect("a set has entries");
                if victim.key == 0 {
                    self.held.fetch_add(1, Ordering::Relaxed);
                } else if victim.meter.due() > now {
                    self.forgiven.inc();
                }
                *victim = Slot {
                    key,
                    meter: rate.meter(),
                };
                victim
            }
        };
        let wait = slot.meter.wait(now);
        if wait > 0.0 {
            Verdict::Refuse {
                retry_after: Duration::from_secs_f64(wait),
            }
        } else {
            slot.meter.charge(now, 1.0);
            Verdict::Pass
        }
    }

    fn hash(&self, zone: u64, client: Client<'_>) -> u64 {
        let mut h = self.hasher.build_hasher();
        zone.hash(&mut h);
        match client {
            Client::Address(ip) => {
                0u8.hash(&mut h);
                counted_address(ip).hash(&mut h);
            }
            Client::Key(key) => {
                1u8.hash(&mut h);
                key.hash(&mut h);
            }
        }
        h.finish()
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, Vec<Slot>> {
        self.shards[hash as usize & (self.shards.len() - 1)]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Shards of [`Connections`].
const CONNECTION_SHARDS: usize = 16;

/// Connections open per client address, all workers together: an entry per address
/// with a connection open, so at most as many as connections are open.
#[derive(Debug)]
pub struct Connections {
    shards: [Mutex<HashMap<IpAddr, u32>>; CONNECTION_SHARDS],
    hasher: RandomState,
    /// Addresses with a connection open.
    tracked: AtomicUsize,
}

impl Default for Connections {
    fn default() -> Self {
        Self {
            shards: std::array::from_fn(|_| Mutex::default()),
            hasher: RandomState::new(),
            tracked: AtomicUsize::new(0),
        }
    }
}

impl Connections {
    /// Counts a connection from `ip` open if its address has fewer than `limit` open:
    /// held until the [`ClientConnection`] is dropped. `None`: at the limit.
    pub fn open(self: &Arc<Self>, ip: IpAddr, limit: u32) -> Option<ClientConnection> {
        let address = counted_address(ip);
        let mut counts = self.shard(address);
        let count = counts.entry(address).or_insert(0);
        if *count >= limit {
            if *count == 0 {
                counts.remove(&address);
            }
            return None;
        }
        *count += 1;
        if *count == 1 {
            self.tracked.fetch_add(1, Ordering::Relaxed);
        }
        Some(ClientConnection {
            counts: self.clone(),
            address,
        })
    }

    /// Connections open from `ip`'s address.
    pub fn open_from(&self, ip: IpAddr) -> u32 {
        let address = counted_address(ip);
        self.shard(address).get(&address).copied().unwrap_or(0)
    }

    /// Addresses with a connection open.
    pub fn tracked(&self) -> usize {
        self.tracked.load(Ordering::Relaxed)
    }

    fn shard(&self, address: IpAddr) -> MutexGuard<'_, HashMap<IpAddr, u32>> {
        let i = self.hasher.hash_one(address) as usize % CONNECTION_SHARDS;
        self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// One connection counted open for its client address, until dropped.
#[derive(Debug)]
pub struct ClientConnection {
    counts: Arc<Connections>,
    address: IpAddr,
}

impl Drop for ClientConnection {
    fn drop(&mut self) {
        let mut counts = self.counts.shard(self.address);
        if let Some(count) = counts.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.address);
                self.counts.tracked.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

/// The per-client limits of a server: its rate table, its connection counts, and what
/// they refused.
#[derive(Debug)]
pub struct Clients {
    /// Every client's rate meters.
    pub rates: RateTable,
    /// Every client address's open connections.
    pub connections: Arc<Connections>,
    limited_requests: Counter,
    limited_connections: Counter,
}

impl Clients {
    /// Limits whose rate table holds `rate_keys` clients at most.
    pub fn new(rate_keys: usize) -> Self {
        Self {
            rates: RateTable::new(rate_keys),
            connections: Arc::default(),
            limited_requests: Counter::new(
                "terminus_limited_requests_total",
                "Requests refused with 429 Too Many Requests: their client was beyond its server's or route's rate and burst.",
            ),
            limited_connections: Counter::new(
                "terminus_limited_connections_total",
                "Connections closed before their handshake: their client address had limits.connections_per_client open.",
            ),
        }
    }

    /// [`RateTable::check`], refusals counted.
    pub fn request(&self, zone: u64, client: Client<'_>, rate: Rate) -> Verdict {
        let verdict = self.rates.check(zone, client, rate);
        if verdict != Verdict::Pass {
            self.limited_requests.inc();
        }
        verdict
    }

    /// [`Connections::open`], refusals counted.
    pub fn connection(&self, ip: IpAddr, limit: u32) -> Option<ClientConnection> {
        let open = self.connections.open(ip, limit);
        if open.is_none() {
            self.limited_connections.inc();
        }
        open
    }
}

impl Render for Clients {
    fn render(&self, out: &mut Exposition) {
        self.limited_requests.render(out);
        self.limited_connections.render(out);
        out.family(
            "terminus_rate_keys",
            Kind::Gauge,
            "Clients (addresses or keys) the rate limits hold a meter for, all workers together: entries in use, never freed (a full table reuses its entries), so after a flood it stays at terminus_rate_keys_max.",
            [(Labels::NONE, self.rates.held())],
        );
        out.family(
            "terminus_rate_keys_max",
            Kind::Gauge,
            "The most the rate limits hold (limits.rate_keys, rounded up to whole sets).",
            [(Labels::NONE, self.rates.capacity())],
        );
        self.rates.forgiven.render(out);
        out.family(
            "terminus_connection_clients",
            Kind::Gauge,
            "Client addresses with connections open, counted for limits.connections_per_client.",
            [(Labels::NONE, self.connections.tracked())],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// Requests from `client` offered at `offered` a second for `seconds`: how many passed.
    fn offer(
        table: &RateTable,
        client: Client<'_>,
        rate: Rate,
        offered: f64,
        seconds: f64,
    ) -> usize {
        let n = (offered * seconds) as usize;
        (0..n)
            .filter(|&i| table.check_at(1, client, rate, i as f64 / offered) == Verdict::Pass)
            .count()
    }

    #[test]
    fn a_client_at_three_times_its_rate_gets_the_rate_and_its_burst() {
        let table = RateTable::new(1024);
        let rate = Rate::new(10, Duration::from_secs(1), 20);
        let passed = offer(&table, Client::Address(ip("192.0.2.1")), rate, 30.0, 10.0);
        // nginx's nodelay: burst + 1 at once, then the rate: 10 s at 10/s beyond them.
        assert!((120..=122).contains(&passed), "{passed}");
        // Another client is counted apart.
        let other = offer(&table, Client::Address(ip("192.0.2.2")), rate, 5.0, 10.0);
        assert_eq!(other, 50);
    }

    #[test]
    fn a_burst_passes_at_once_and_the_next_is_told_when_to_retry() {
        let table = RateTable::new(64);
        let rate = Rate::new(2, Duration::from_secs(1), 3);
        let me = Client::Key(b"api-key-1");
        for _ in 0..4 {
            assert_eq!(table.check_at(1, me, rate, 0.0), Verdict::Pass);
        }
        let Verdict::Refuse { retry_after } = table.check_at(1, me, rate, 0.0) else {
            panic!("beyond the burst");
        };
        assert!(
            (retry_after.as_secs_f64() - 0.5).abs() < 1e-6,
            "{retry_after:?}"
        );
        // A refusal is not counted: half a second on, one passes.
        assert_eq!(table.check_at(1, me, rate, 0.5), Verdict::Pass);
        // Another zone (another route's rate) counts the same client apart.
        assert_eq!(table.check_at(2, me, rate, 0.5), Verdict::Pass);
    }

    #[test]
    fn ipv6_clients_are_counted_by_their_64_and_mapped_ipv4_as_ipv4() {
        assert_eq!(
            counted_address(ip("2001:db8:1:2:aaaa::1")),
            ip("2001:db8:1:2::")
        );
        assert_eq!(counted_address(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
        let table = RateTable::new(64);
        let rate = Rate::new(1, Duration::from_secs(60), 0);
        let first = Client::Address(ip("2001:db8:1:2::1"));
        assert_eq!(table.check_at(1, first, rate, 0.0), Verdict::Pass);
        let same_64 = Client::Address(ip("2001:db8:1:2:ffff::9"));
        assert_ne!(table.check_at(1, same_64, rate, 1.0), Verdict::Pass);
        let next_64 = Client::Address(ip("2001:db8:1:3::1"));
        assert_eq!(table.check_at(1, next_64, rate, 1.0), Verdict::Pass);
    }

    /// 100,000 distinct addresses, one request each, into a table of 4,096: it never
    /// holds more, and a client that owes more than the flood's (its burst spent at a
    /// slow rate) is not the one forgotten.
    #[test]
    fn a_flood_of_addresses_keeps_the_table_at_its_bound_and_keeps_the_indebted() {
        let table = RateTable::new(4096);
        assert_eq!(table.capacity(), 4096);
        // The flood's clients each owe 1 s; the heavy one, its burst spent, 6 s.
        let rate = Rate::new(1, Duration::from_secs(1), 5);
        let heavy = Client::Address(ip("198.51.100.1"));
        while table.check_at(1, heavy, rate, 0.0) == Verdict::Pass {}
        for i in 0..100_000u32 {
            let spoofed = IpAddr::from((0x0a00_0000 + i).to_be_bytes());
            let now = 0.1 * f64::from(i) / 100_000.0;
            assert_eq!(
                table.check_at(1, Client::Address(spoofed), rate, now),
                Verdict::Pass
            );
            assert!(table.held() <= table.capacity());
        }
        assert_eq!(table.held(), table.capacity());
        assert_ne!(
            table.check_at(1, heavy, rate, 0.1),
            Verdict::Pass,
            "the client that owed most was kept"
        );
        // The memory is the table's, fixed: its entries and nothing per client beyond.
        let bytes = table.capacity() * std::mem::size_of::<Slot>();
        assert!(bytes <= 4096 * 32, "{bytes}");
    }

    #[test]
    fn a_full_table_takes_the_entry_that_owes_nothing_first() {
        // One shard, one set.
        let table = RateTable::new(WAYS);
        assert_eq!(table.capacity(), WAYS);
        let slow = Rate::new(1, Duration::from_secs(100), 0);
        let fast = Rate::new(1000, Duration::from_secs(1), 0);
        let a = |i: u32| Client::Address(IpAddr::from((0xc000_0200 + i).to_be_bytes()));
        // Seven clients owing 100 s each, one owing 1 ms.
        for i in 0..7 {
            assert_eq!(table.check_at(1, a(i), slow, 0.0), Verdict::Pass);
        }
        assert_eq!(table.check_at(2, a(7), fast, 0.0), Verdict::Pass);
        // At 1 s a new client takes the entry that owes nothing any more.
        assert_eq!(table.check_at(1, a(8), slow, 1.0), Verdict::Pass);
        assert_eq!(table.forgiven.get(), 0);
        for i in 0..7 {
            assert_ne!(
                table.check_at(1, a(i), slow, 1.0),
                Verdict::Pass,
                "{i} kept"
            );
        }
    }

    #[test]
    fn connections_are_counted_per_address_until_closed() {
        let counts = Arc::new(Connections::default());
        let one = ip("192.0.2.1");
        let held: Vec<_> = (0..3).map(|_| counts.open(one, 3).expect("room")).collect();
        assert!(counts.open(one, 3).is_none(), "the fourth");
        assert!(counts.open(ip("192.0.2.2"), 3).is_some(), "another address");
        assert_eq!(counts.tracked(), 1, "the other's closed at once");
        // One of the same /64 is the same client.
        let six = ip("2001:db8::1");
        let _six = counts.open(six, 1).expect("room");
        assert!(counts.open(ip("2001:db8::2"), 1).is_none());
        drop(held);
        assert_eq!(counts.open_from(one), 0);
        assert_eq!(counts.tracked(), 1, "only the IPv6 client's");
        assert!(counts.open(one, 3).is_some());
    }

    /// What a check costs (printed, for the record; asserted loosely): one thread, then
    /// two at once on the same table (the workers).
    #[test]
    fn a_check_costs_well_under_a_microsecond() {
        let table = Arc::new(RateTable::new(100_000));
        let rate = Rate::new(100, Duration::from_secs(1), 10);
        let run = |table: &RateTable, base: u32| {
            let n = 200_000u32;
            let start = Instant::now();
            for i in 0..n {
                let ip = IpAddr::from((base + i % 50_000).to_be_bytes());
                std::hint::black_box(table.check(1, Client::Address(ip), rate));
            }
            start.elapsed().as_nanos() as f64 / f64::from(n)
        };
        let alone = run(&table, 0x0a00_0000);
        let both: Vec<f64> = std::thread::scope(|s| {
            let a = s.spawn(|| run(&table, 0x0b00_0000));
            let b = s.spawn(|| run(&table, 0x0c00_0000));
            vec![a.join().unwrap(), b.join().unwrap()]
        });
        println!(
            "rate check: {alone:.0} ns alone, {:.0} and {:.0} ns with two threads",
            both[0], both[1]
        );
        // Debug builds are slower; the bound is for a sign of something quadratic.
        assert!(alone < 5_000.0, "{alone} ns");
    }
}
