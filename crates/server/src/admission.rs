//! Admission control: a worker takes on a handshake only if the handshake work it has
//! already taken on can be done within `limits.handshake_queue`.
//!
//! A flood of handshakes beyond what a worker computes would otherwise queue without
//! bound: each waits behind all the earlier ones, latency grows until clients time out,
//! and the worker ends up computing handshakes nobody waits for any more (nginx and
//! HAProxy at 1.5x their maximum). The work taken on is the handshakes admitted and not
//! yet finished times what one costs this worker: its thread's CPU time per finished
//! handshake, measured as it runs (so it covers the backend in use, the key types and the
//! traffic mix). Beyond the bound:
//!
//! - once its ClientHello is read, a full handshake is refused with a fatal
//!   `internal_error` alert (RFC 8446: "an internal error unrelated to the peer"), so the
//!   client learns at once that the server, not the network, said no; a resumption (no
//!   signature, a fraction of the cost) is still admitted up to a quarter more work, so
//!   returning clients keep getting in while new ones are turned away;
//! - while reading and refusing ClientHellos would itself cost more than a twentieth of
//!   the worker's time, new connections are reset at accept instead, unread (a few µs
//!   each), so that refusing never eats the capacity it protects.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How long a measurement window lasts.
const WINDOW: Duration = Duration::from_millis(100);
/// What reading a ClientHello and refusing it costs a worker, about (bench/overload).
const REFUSAL_COST: Duration = Duration::from_micros(20);
/// The share of a worker's time refusals at the ClientHello may take.
const REFUSAL_SHARE: f64 = 0.05;
/// The cost assumed before the first measurement: a scalar RSA-2048 handshake.
const FIRST_COST: Duration = Duration::from_micros(500);

/// One worker's admission state.
pub(crate) struct Admission {
    /// `limits.handshake_queue`; `None`: everything is admitted.
    bound: Option<Duration>,
    admitted: Cell<u32>,
    /// CPU per handshake, smoothed over windows.
    cost: Cell<Duration>,
    window: Cell<Window>,
    /// Reset connections at accept while there is no room (see the module docs).
    shedding: Cell<bool>,
}

#[derive(Clone, Copy)]
struct Window {
    started: Instant,
    cpu: Duration,
    finished: u32,
    refused: u32,
}

/// Why a connection was turned away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Reset at accept, unread.
    AtAccept,
    /// Refused with an alert after its ClientHello.
    AtHello,
}

impl Refusal {
    pub(crate) const ALL: [Refusal; 2] = [Refusal::AtAccept, Refusal::AtHello];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Refusal::AtAccept => "overload_at_accept",
            Refusal::AtHello => "overload_at_hello",
        }
    }
}

/// An admitted handshake: counted as work taken on until dropped.
pub(crate) struct Ticket(Rc<Admission>);

impl Drop for Ticket {
    fn drop(&mut self) {
        let a = &self.0;
        a.admitted.set(a.admitted.get() - 1);
        let mut w = a.window.get();
        w.finished += 1;
        a.window.set(w);
    }
}

impl Admission {
    /// `bound`: `limits.handshake_queue`, zero for none.
    pub(crate) fn new(bound: Duration) -> Rc<Self> {
        Rc::new(Self {
            bound: (!bound.is_zero()).then_some(bound),
            admitted: Cell::new(0),
            cost: Cell::new(FIRST_COST),
            window: Cell::new(Window {
                started: Instant::now(),
                cpu: thread_cpu(),
                finished: 0,
                refused: 0,
            }),
            shedding: Cell::new(false),
        })
    }

    /// Whether a connection just accepted, after `waited` in the listen queue, may be
    /// read; false: reset it. A connection that waited longer than the bound, less the
    /// work admitted before it, would be answered too late: the queue that builds under
    /// overload is the kernel's, which the work taken on does not see.
    pub(crate) fn at_accept(&self, waited: Duration) -> bool {
        self.roll();
        let Some(bound) = self.bound else {
            return true;
        };
        let stale = waited + self.cost.get() * self.admitted.get() > bound;
        if stale || (self.shedding.get() && self.full(1.0)) {
            // Counted as a refusal too: shedding lasts while the flood would cost that much.
            self.refused();
            return false;
        }
        true
    }

    fn refused(&self) {
        let mut w = self.window.get();
        w.refused += 1;
        self.window.set(w);
    }

    /// Admits a handshake whose ClientHello was read (`resumption`: it asks to resume),
    /// or says no.
    pub(crate) fn at_hello(self: &Rc<Self>, resumption: bool) -> Option<Ticket> {
        self.roll();
        let room = if resumption { 1.25 } else { 1.0 };
        if self.full(room) {
            self.refused();
            return None;
        }
        self.admitted.set(self.admitted.get() + 1);
        Some(Ticket(self.clone()))
    }

    /// The work taken on, with one more handshake, is over `share` of the bound.
    fn full(&self, share: f64) -> bool {
        let Some(bound) = self.bound else {
            return false;
        };
        let work = self.cost.get() * (self.admitted.get() + 1);
        work.as_secs_f64() > bound.as_secs_f64() * share
    }

    /// Ends the measurement window once it is over: a new cost from the CPU time the
    /// worker spent per handshake finished in it, and whether refusals at the ClientHello
    /// cost too much to go on reading them.
    fn roll(&self) {
        let w = self.window.get();
        let now = Instant::now();
        let elapsed = now.duration_since(w.started);
        if elapsed < WINDOW || self.bound.is_none() {
            return;
        }
        let cpu = thread_cpu();
        let refusing = REFUSAL_COST * w.refused;
        if w.finished >= 8 {
            let sample = cpu.saturating_sub(w.cpu).saturating_sub(refusing) / w.finished;
            // Weighted toward the past: one odd window moves it a little.
            self.cost.set((self.cost.get() * 7 + sample * 3) / 10);
        }
        self.shedding
            .set(refusing.as_secs_f64() > elapsed.as_secs_f64() * REFUSAL_SHARE);
        self.window.set(Window {
            started: now,
            cpu,
            finished: 0,
            refused: 0,
        });
    }
}

fn thread_cpu() -> Duration {
    terminus_sys::thread_cpu_time().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Room for `bound / FIRST_COST` handshakes until a measurement says otherwise.
    #[test]
    fn full_handshakes_are_admitted_up_to_the_bound_and_resumptions_a_quarter_beyond() {
        let admission = Admission::new(FIRST_COST * 20);
        let full: Vec<Ticket> = (0..20)
            .map(|i| {
                admission
                    .at_hello(false)
                    .unwrap_or_else(|| panic!("full handshake {i} refused"))
            })
            .collect();
        assert!(
            admission.at_hello(false).is_none(),
            "the 21st is over the bound"
        );
        let resumed: Vec<Ticket> = (0..5)
            .map(|i| {
                admission
                    .at_hello(true)
                    .unwrap_or_else(|| panic!("resumption {i} refused"))
            })
            .collect();
        assert!(
            admission.at_hello(true).is_none(),
            "room for a quarter more only"
        );
        assert!(
            !admission.at_accept(Duration::ZERO),
            "the work ahead is over the bound"
        );
        drop(resumed);
        drop(full.into_iter().next());
        assert!(
            admission.at_accept(Duration::ZERO),
            "not shedding: refusals were cheap"
        );
        assert!(
            admission.at_hello(false).is_some(),
            "a finished one made room"
        );
    }

    #[test]
    fn a_costly_flood_of_refusals_turns_to_resets_at_accept_while_there_is_no_room() {
        let admission = Admission::new(FIRST_COST * 2);
        let held: Vec<Ticket> = (0..2).filter_map(|_| admission.at_hello(false)).collect();
        assert_eq!(held.len(), 2);
        // More refusals in a window than REFUSAL_SHARE of it pays for.
        let over = (WINDOW.as_secs_f64() * REFUSAL_SHARE / REFUSAL_COST.as_secs_f64()) as u32 + 1;
        for _ in 0..over {
            assert!(admission.at_hello(false).is_none());
        }
        std::thread::sleep(WINDOW);
        assert!(!admission.at_accept(Duration::ZERO), "shedding while full");
        drop(held);
        assert!(
            admission.at_accept(Duration::ZERO),
            "room again: read the next one"
        );
    }

    #[test]
    fn a_connection_that_waited_out_the_bound_is_reset_at_accept() {
        let admission = Admission::new(FIRST_COST * 20);
        assert!(admission.at_accept(FIRST_COST * 19));
        assert!(
            !admission.at_accept(FIRST_COST * 21),
            "waited longer than the bound"
        );
        let held: Vec<Ticket> = (0..10).filter_map(|_| admission.at_hello(false)).collect();
        assert!(
            !admission.at_accept(FIRST_COST * 11),
            "waited less than the bound, but the work ahead of it adds up to more"
        );
        drop(held);
    }

    #[test]
    fn no_bound_admits_everything() {
        let admission = Admission::new(Duration::ZERO);
        let held: Vec<Ticket> = (0..10_000)
            .filter_map(|_| admission.at_hello(false))
            .collect();
        assert_eq!(held.len(), 10_000);
        assert!(admission.at_accept(Duration::ZERO));
    }
}
