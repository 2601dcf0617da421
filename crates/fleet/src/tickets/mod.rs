//! Session tickets sealed with keys that rotate by epoch, the same on every instance.
//!
//! Time is cut into periods of `rotate` (epoch `n` is `[n·rotate, (n+1)·rotate)` of Unix
//! time, so instances agree on it without talking). A ticket is sealed with the current
//! epoch's key and opened with the current key, the `keep - 1` before it, or the next
//! one: an instance whose clock runs ahead of another's seals with a key the other
//! already holds, because every key exists a period before it is used. A key older than
//! `keep` periods is erased, so a recorded session stays sealed for at most `keep`
//! periods: forward secrecy as Twitter's and Cloudflare's rotations give it.
//!
//! - [`key`]: one key, its name, sealing and opening, and its wrapped form for a store;
//! - [`ring`]: the keys held, by epoch, and which seals and which may open;
//! - [`Ticketer`]: rustls's [`ProducesTickets`] over a ring.
//!
//! The handshake path never leaves memory: a ticket names its key, and the key is in the
//! ring or the ticket is not resumed (a full handshake, never an error).

pub mod key;
pub mod ring;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::server::ProducesTickets;
use terminus_metrics::{label_values, Counter, Exposition, Kind, Labelled, Labels, Render};

pub use key::{Kek, KeyMaterial, TicketKey, NAME_LEN};
pub use ring::Ring;

/// Why a [`Rotation`] cannot work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RotationError {
    /// `rotate` is under a second, or not whole seconds.
    #[error("rotate is a whole number of seconds, at least 1s")]
    NotWholeSeconds,
    /// `rotate` is longer than a ticket may live.
    #[error("rotate is at most 7 days (a TLS 1.3 ticket's longest life)")]
    TooLong,
    /// `keep` is out of its range.
    #[error("keep is between 2 and 64: with 1, a ticket sealed late in a period would be useless at once")]
    Keep,
}

/// How often the keys rotate and how many periods a ticket stays valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// The length of an epoch.
    pub rotate: Duration,
    /// Epochs whose keys open tickets: the current one and `keep - 1` before it (at
    /// least 2, else a ticket sealed late in a period would not outlive it).
    pub keep: u32,
}

impl Default for Rotation {
    /// Six hours, two kept: nginx's previous and current key, and Caddy's order of time.
    fn default() -> Self {
        Self {
            rotate: Duration::from_secs(6 * 3600),
            keep: 2,
        }
    }
}

impl Rotation {
    /// The longest `rotate` a ticket's lifetime can follow: TLS 1.3 tickets live at most
    /// seven days (RFC 8446 section 4.6.1).
    pub const MAX_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);

    /// Why these settings cannot work, if they cannot.
    pub fn check(&self) -> Result<(), RotationError> {
        if self.rotate < Duration::from_secs(1) || self.rotate.subsec_nanos() != 0 {
            return Err(RotationError::NotWholeSeconds);
        }
        if self.rotate > Self::MAX_LIFETIME {
            return Err(RotationError::TooLong);
        }
        if !(2..=64).contains(&self.keep) {
            return Err(RotationError::Keep);
        }
        Ok(())
    }

    /// Seconds in an epoch.
    pub fn period(&self) -> u64 {
        self.rotate.as_secs().max(1)
    }

    /// The epoch at Unix time `unix` (seconds).
    pub fn epoch_at(&self, unix: u64) -> u64 {
        unix / self.period()
    }

    /// What a ticket's lifetime hint promises: the time a ticket sealed at the very end
    /// of an epoch still opens, `keep - 1` periods, at most seven days.
    pub fn lifetime(&self) -> u32 {
        let secs = self.period() * u64::from(self.keep - 1);
        secs.min(Self::MAX_LIFETIME.as_secs()) as u32
    }
}

/// What a ticket key handed to a successor process is bound to (its sealing's label).
const HANDOVER_LABEL: &[u8] = b"terminus handover ticket key v1";

/// The ring, read; a panic elsewhere while it was held (poisoning) does not stop tickets.
pub(crate) fn read(ring: &RwLock<Ring>) -> std::sync::RwLockReadGuard<'_, Ring> {
    ring.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The ring, to change.
pub(crate) fn write(ring: &RwLock<Ring>) -> std::sync::RwLockWriteGuard<'_, Ring> {
    ring.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Seconds of Unix time now.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The system clock.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    })
}

/// Key ages a ticket was opened with, for the metrics.
const AGES: [&str; 4] = ["next", "current", "previous", "older"];

/// Seals and opens tickets with the keys of a [`Ring`]. When an epoch begins and no key
/// came for it from elsewhere, the ticketer makes one of its own (alone, that is its
/// rotation; in a fleet, what it does while the store is away).
pub struct Ticketer {
    ring: Arc<RwLock<Ring>>,
    clock: Clock,
    /// The epoch the ring was last brought up to.
    advanced: AtomicU64,
    metrics: Arc<TicketMetrics>,
}

impl std::fmt::Debug for Ticketer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticketer")
            .field("advanced", &self.advanced)
            .finish_non_exhaustive()
    }
}

impl Ticketer {
    /// A ticketer over `ring`, reading the time from `clock`.
    pub fn new(ring: Arc<RwLock<Ring>>, clock: Clock) -> Self {
        Self {
            clock,
            advanced: AtomicU64::new(u64::MAX),
            metrics: Arc::new(TicketMetrics::new(ring.clone())),
            ring,
        }
    }

    /// A ticketer alone: its own keys, rotated by the system clock.
    pub fn local(rotation: Rotation) -> Self {
        Self::new(Arc::new(RwLock::new(Ring::new(rotation))), system_clock())
    }

    /// Its counters, for `/metrics`.
    pub fn metrics(&self) -> Arc<TicketMetrics> {
        self.metrics.clone()
    }

    /// Every key held, each sealed under `kek` (a key only this process and the one
    /// taking over from it know): `(epoch, from the store, wrapped material)`, what
    /// [`Ticketer::adopt`] takes there. Raw key material never leaves the process.
    pub fn export(&self, kek: &Kek) -> Vec<(u64, bool, Vec<u8>)> {
        let (ring, _) = self.current();
        ring.materials()
            .map(|(epoch, shared, material)| (epoch, shared, material.wrap(kek, HANDOVER_LABEL)))
            .collect()
    }

    /// Takes the keys the process this one replaced held ([`Ticketer::export`] there,
    /// under the same `kek`), so that the tickets it issued resume here: how many were
    /// taken (one that does not open under `kek`, or is past `keep`, is not).
    pub fn adopt(&self, kek: &Kek, keys: &[(u64, bool, Vec<u8>)]) -> usize {
        let unix = (self.clock)();
        let mut ring = write(&self.ring);
        let now = ring.rotation().epoch_at(unix);
        keys.iter()
            .filter(|(epoch, shared, wrapped)| {
                KeyMaterial::unwrap(kek, HANDOVER_LABEL, wrapped)
                    .is_some_and(|material| ring.adopt(*epoch, *shared, &material, now))
            })
            .count()
    }

    /// The ring, read, and the current epoch, the ring brought up to it first if it is
    /// new (one read lock a ticket in the common case).
    fn current(&self) -> (std::sync::RwLockReadGuard<'_, Ring>, u64) {
        let unix = (self.clock)();
        let ring = read(&self.ring);
        let epoch = ring.rotation().epoch_at(unix);
        if self.advanced.load(Ordering::Acquire) == epoch {
            return (ring, epoch);
        }
        drop(ring);
        write(&self.ring).advance(epoch);
        // The clock's epoch, even an older one: a maximum would keep every ticket on the
        // write lock for as long as a clock stepped back lags (and, starting from
        // `u64::MAX`, for ever).
        self.advanced.store(epoch, Ordering::Release);
        (read(&self.ring), epoch)
    }
}

impl ProducesTickets for Ticketer {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        read(&self.ring).rotation().lifetime()
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let (ring, epoch) = self.current();
        let sealed = ring.sealing(epoch)?.seal(plain);
        if sealed.is_some() {
            self.metrics.sealed.inc();
        }
        sealed
    }

    fn decrypt(&self, ticket: &[u8]) -> Option<Vec<u8>> {
        let (ring, epoch) = self.current();
        let (key_epoch, key) = ring.opening(ticket, epoch)?;
        let plain = key.open(ticket)?;
        let age = match epoch.checked_sub(key_epoch) {
            None => 0,
            Some(0) => 1,
            Some(1) => 2,
            Some(_) => 3,
        };
        self.metrics.opened.inc(age);
        Some(plain)
    }
}

/// What the ticketer did.
pub struct TicketMetrics {
    sealed: Counter,
    opened: Labelled<4>,
    /// Read for the keys made here.
    ring: Arc<RwLock<Ring>>,
}

impl std::fmt::Debug for TicketMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TicketMetrics")
            .field("sealed", &self.sealed)
            .finish_non_exhaustive()
    }
}

/// The series of the keys made here.
const MADE_LOCALLY: &str = "terminus_ticket_keys_made_locally_total";
const ROTATIONS: &str = "terminus_ticket_key_rotations_total";
const EPOCH: &str = "terminus_ticket_key_epoch";
const HELD: &str = "terminus_ticket_keys_held";

impl TicketMetrics {
    fn new(ring: Arc<RwLock<Ring>>) -> Self {
        Self {
            sealed: Counter::new(
                "terminus_tickets_sealed_total",
                "Session tickets sealed (issued).",
            ),
            opened: Labelled::counter(
                "terminus_tickets_opened_total",
                "Session tickets opened, by the age of their key: the next epoch's, the current, the previous, or older (within keep).",
                label_values("key", AGES, &Labels::NONE),
            ),
            ring,
        }
    }

    /// Tickets opened with a key of the given age (`"next"`, `"current"`, ...).
    pub fn opened(&self, age: &str) -> i64 {
        AGES.iter()
            .position(|a| *a == age)
            .map_or(0, |i| self.opened.get(i))
    }
}

impl Render for TicketMetrics {
    fn render(&self, out: &mut Exposition) {
        self.sealed.render(out);
        self.opened.render(out);
        out.header(
            MADE_LOCALLY,
            Kind::Counter,
            "Ticket keys this instance made itself: its rotation when alone; in a fleet, epochs the store gave no key for in time.",
        );
        let ring = read(&self.ring);
        out.sample(MADE_LOCALLY, &Labels::NONE, ring.made());
        out.header(
            ROTATIONS,
            Kind::Counter,
            "Times the sealing ticket key's epoch moved on (one a rotate period).",
        );
        out.sample(ROTATIONS, &Labels::NONE, ring.rotations());
        out.header(
            EPOCH,
            Kind::Gauge,
            "The newest epoch the ring was brought to (Unix time over the rotate period): the one whose key seals, unless the clock went back.",
        );
        out.sample(EPOCH, &Labels::NONE, ring.epoch().unwrap_or(0));
        out.header(
            HELD,
            Kind::Gauge,
            "Ticket keys held in memory, from the fleet store or made here.",
        );
        let store = ring.keys().filter(|(_, shared, _)| *shared).count();
        let total = ring.keys().count();
        out.sample(HELD, &Labels::of([("source", "store")]), store);
        out.sample(HELD, &Labels::of([("source", "local")]), total - store);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ticketer alone, on a clock the test moves.
    fn alone(keep: u32) -> (Ticketer, Arc<AtomicU64>) {
        let now = Arc::new(AtomicU64::new(1_000_000));
        let clock = now.clone();
        let rotation = Rotation {
            rotate: Duration::from_secs(10),
            keep,
        };
        let ticketer = Ticketer::new(
            Arc::new(RwLock::new(Ring::new(rotation))),
            Arc::new(move || clock.load(Ordering::Relaxed)),
        );
        (ticketer, now)
    }

    #[test]
    fn alone_tickets_open_for_keep_periods_and_the_key_rotates_each_period() {
        let (t, now) = alone(2);
        assert_eq!(t.lifetime(), 10);
        let first = t.encrypt(b"state").unwrap();
        assert_eq!(t.decrypt(&first).as_deref(), Some(&b"state"[..]));
        // The next period: a new key seals; the old one still opens.
        now.fetch_add(10, Ordering::Relaxed);
        let second = t.encrypt(b"state").unwrap();
        assert_ne!(first[..NAME_LEN], second[..NAME_LEN], "a new key name");
        assert!(t.decrypt(&first).is_some());
        assert_eq!(t.metrics.opened("previous"), 1);
        // Two periods on: the first key is gone.
        now.fetch_add(10, Ordering::Relaxed);
        assert!(t.decrypt(&first).is_none());
        assert!(t.decrypt(&second).is_some());
        assert!(t.decrypt(b"short").is_none());
        assert_eq!(read(&t.ring).made(), 3);
    }

    /// A process taking over from another takes its keys (sealed under the handover's
    /// key): the tickets the first issued open in the second, and the second seals
    /// with the same key, so its tickets open in the first while it drains; under
    /// another key nothing is taken.
    #[test]
    fn keys_handed_over_open_the_old_tickets_and_seal_alike() {
        let (old, _) = alone(2);
        let issued = old.encrypt(b"state").unwrap();
        let kek = Kek::from_hex(&"ab".repeat(32)).unwrap();
        let keys = old.export(&kek);
        assert_eq!(keys.len(), 1);
        let (new, _) = alone(2);
        let other = Kek::from_hex(&"cd".repeat(32)).unwrap();
        assert_eq!(new.adopt(&other, &keys), 0, "sealed under another key");
        assert!(new.decrypt(&issued).is_none());
        assert_eq!(new.adopt(&kek, &keys), 1);
        assert_eq!(new.adopt(&kek, &keys), 0, "taken once");
        assert_eq!(new.decrypt(&issued).as_deref(), Some(&b"state"[..]));
        let sealed = new.encrypt(b"later").unwrap();
        assert_eq!(
            sealed[..NAME_LEN],
            issued[..NAME_LEN],
            "the adopted key seals"
        );
        assert_eq!(old.decrypt(&sealed).as_deref(), Some(&b"later"[..]));
    }

    #[test]
    fn after_a_clock_steps_back_tickets_still_open_and_take_the_read_lock_only() {
        let (t, now) = alone(2);
        now.fetch_add(10, Ordering::Relaxed);
        let sealed = t.encrypt(b"state").unwrap();
        now.fetch_sub(10, Ordering::Relaxed);
        assert_eq!(t.decrypt(&sealed).as_deref(), Some(&b"state"[..]));
        // The fast path (no write lock) holds when the ring was last brought to the
        // clock's epoch.
        let epoch = now.load(Ordering::Relaxed) / 10;
        assert_eq!(t.advanced.load(Ordering::Acquire), epoch);
    }

    #[test]
    fn rotation_settings_are_checked() {
        let r = |secs: u64, keep: u32| Rotation {
            rotate: Duration::from_secs(secs),
            keep,
        };
        assert!(r(3600, 2).check().is_ok());
        assert!(r(0, 2).check().is_err());
        assert!(r(60, 1).check().is_err());
        assert!(r(8 * 86_400, 2).check().is_err());
        assert!(Rotation {
            rotate: Duration::from_millis(1500),
            keep: 2
        }
        .check()
        .is_err());
        // Lifetime: keep - 1 periods, at most a week.
        assert_eq!(r(3600, 3).lifetime(), 7200);
        assert_eq!(r(86_400 * 5, 3).lifetime(), 7 * 86_400);
    }
}
