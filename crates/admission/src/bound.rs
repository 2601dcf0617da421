//! Admission control: a worker takes on a connection only if the time it already waited
//! in the listen queue and the handshake work taken on before it fit in
//! `limits.handshake_queue`.
//!
//! A flood of handshakes beyond what a worker computes would otherwise queue without
//! bound: each waits behind all the earlier ones, latency grows until clients time out,
//! and the worker ends up computing handshakes nobody waits for any more (nginx and
//! HAProxy at 1.5x their maximum). The work taken on is the handshakes under way times
//! what one costs this worker: the time its thread spends running handshake work per
//! finished handshake, measured as it runs (so it covers the backend in use, the key
//! types and the handshake mix). Only handshake work is counted: accepting, connections
//! up to the end of their handshake, and the engine's own batch tasks
//! ([`Admission::metered`], `Engine::flush_task_time`); what requests on established
//! connections take is not a handshake's cost (counted in, the next 50 connections after
//! a spell of HTTP/2 keep-alive traffic were refused as if each handshake cost a window's
//! requests: 100-150 errors in bench/report's keep-alive section). Plus the
//! connections whose ClientHello is not read yet, each weighed as the share of read ones
//! that went on to a handshake (under a tenant's flood beyond its quota most are refused
//! for a few µs). A handshake sleeping on its tenant's quota is no work ahead of anyone
//! and sets its room aside. The wait is the kernel's (`TCP_INFO`), since under overload
//! the queue that builds is the listen queue, which that work does not see.
//!
//! Tenants within their committed rate are apart: a handshake its tenant's quota admits
//! at once, as committed capacity ([`Line`]), is ahead of another such handshake of a
//! different tenant only as far as the engine's fair queue puts it there, which serves
//! tenants in proportion to their committed rates (`terminus_engine`'s `fair`): its
//! tenant's own such handshakes are ahead of it, and of each other tenant's as many as
//! that tenant's weight against its own allows (generalized processor sharing). The
//! handshakes of tenants past their committed rate (queued for it, borrowed, or without
//! a quota) are ahead of nobody in that count, and are themselves admitted only while
//! all the work taken on fits. A line's count leaves out what the fair queue serves after
//! it (heavier lines that came later, the handshakes in no line), so all the handshakes
//! under way must also fit in twice the bound ([`LINES_CEILING`]): lines alone could otherwise
//! stack up without end (ten tenants of doubling weights, lightest first, had over five
//! times the bound under way). Counted as ahead of everyone, a tenant flooding at three
//! times its quota on a worker short of CPU (two busy neighbours on two cores) had the
//! bound full of its own admitted handshakes and got three in four of a neighbour's
//! connections, a fifth of that one's quota, reset at accept. Which tenant a connection
//! is for is known from its ClientHello: while some host has a quota (`quotas`), a
//! connection is reset at accept only for what is ahead of it whoever's it is (the
//! listen queue's wait, reading the connections taken on before it, its own handshake),
//! or when refusing costs too much; the rest is decided after its ClientHello, where a
//! flood's handshakes are refused with an alert (a few µs each), and a resumption so
//! taken on is weighed against its room there (else a client replaying a ticket, or a
//! reconnect storm, would be taken on without bound). Without quotas nothing changes.
//!
//! - At accept, a connection beyond the bound is reset, unread (a few µs, no TIME_WAIT).
//!   Up to a quarter beyond it connections are still read, for resumptions' sake, where
//!   resumption is on: without it they could only be refused after their ClientHello,
//!   later (behind everything the worker has to run) and at a higher cost than a reset.
//! - Once its ClientHello is read, a full handshake beyond the bound is refused with a
//!   fatal `internal_error` alert (RFC 8446: "an internal error unrelated to the peer"),
//!   so the client learns at once that the server, not the network, said no; a
//!   resumption (no signature, a fraction of the cost) takes the quarter above it, so
//!   returning clients keep getting in while new ones are turned away.
//! - While reading and refusing ClientHellos would cost more than a twentieth of the
//!   worker's time, that quarter is not read: everything beyond the bound is reset at
//!   accept, so that refusing never eats the capacity it protects.
//!
//! The same windows tell whether the worker has capacity nobody is using ([`Admission::idle`]):
//! it slept (its event loop parked with nothing to run) for a tenth of the last one. That
//! is when a tenant may borrow beyond its committed quota (the server asks it at the
//! ClientHello, with the tenant's account from [`crate::tenant`]). Its share of the
//! CPU would not do: on a shared machine a saturated worker is on the CPU well under all
//! of the time, and would lend what it does not have.

use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;
use std::time::{Duration, Instant};

use terminus_engine::busy::{BusyTime, Metered};

/// A tenant's line of handshakes within its committed rate: which tenant, and its weight
/// in the engine's fair queueing (its committed ACU).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Line {
    /// The tenant, as the engine's [`terminus_engine::Payer::id`] tells it.
    pub id: usize,
    /// Its weight.
    pub weight: f64,
}

/// How long a measurement window lasts.
const WINDOW: Duration = Duration::from_millis(100);
/// What reading a ClientHello and refusing it costs a worker, about (bench/overload).
const REFUSAL_COST: Duration = Duration::from_micros(20);
/// The share of a worker's time refusals at the ClientHello may take.
const REFUSAL_SHARE: f64 = 0.05;
/// The cost assumed before the first measurement: a scalar RSA-2048 handshake.
const FIRST_COST: Duration = Duration::from_micros(500);
/// How far beyond the bound resumptions are taken on, and so connections read.
const RESUMPTION_ROOM: f64 = 1.25;
/// How far beyond the bound (or a resumption's room) the handshakes under way may go for
/// a handshake in a tenant's line: each line's count leaves out what the fair queue
/// serves after it (heavier lines that came later, and handshakes in no line), so lines
/// alone could stack up without end; twice leaves a line a whole bound of room beside
/// one filled by handshakes past their tenants' committed rates. Connections not read
/// yet are not counted: they are no handshake until their ClientHello is weighed here
/// (counted, a flooding neighbour's unread connections, mostly for its quota's queue,
/// got a tenant within its committed rate one or two in eighty refused beside two CPU
/// hogs).
const LINES_CEILING: f64 = 2.0;
/// A worker awake (not sleeping for want of work) less than this share of the last
/// window has capacity to lend.
const IDLE_BELOW: f64 = 0.9;

/// One worker's admission state.
pub struct Admission {
    /// `limits.handshake_queue`; `None`: everything is admitted.
    bound: Option<Duration>,
    /// Connections taken on whose ClientHello is not read yet, and handshakes under way.
    unread: Cell<u32>,
    working: Cell<u32>,
    /// Of the handshakes under way, those admitted within their tenant's committed rate,
    /// by tenant: (line, how many).
    lines: std::cell::RefCell<Vec<(Line, u32)>>,
    /// The share of ClientHellos read that went on to a handshake (the others were
    /// refused: by a tenant's quota, or the bound), smoothed over windows. An unread
    /// connection is that much of a handshake's work: under a tenant's flood beyond its
    /// quota most are refusals costing a few µs, and counting each as a handshake would
    /// get everyone else reset at accept.
    went_on: Cell<f64>,
    /// Time per handshake, smoothed over windows.
    cost: Cell<Duration>,
    window: Cell<Window>,
    /// Reset connections at accept while there is no room (see the module docs).
    shedding: Cell<bool>,
    /// The share of the last window the worker's event loop was awake.
    busy: Cell<f64>,
    /// The time of handshake work run through [`Admission::metered`].
    handshakes: BusyTime,
    /// The engine's flush tasks' time so far (handshake work too).
    flush_tasks: Box<dyn Fn() -> Duration>,
}

#[derive(Clone, Copy)]
struct Window {
    started: Instant,
    /// The worker's sleep so far ([`terminus_engine::parked_time`]), when it started.
    parked: Duration,
    /// Handshake work's time so far, when the window started.
    handshake_time: Duration,
    /// Handshakes under way when the window started.
    working: u32,
    finished: u32,
    refused: u32,
    /// Refused after their ClientHello.
    refused_read: u32,
}

/// Why a connection was turned away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Reset at accept, unread.
    AtAccept,
    /// Refused with an alert after its ClientHello.
    AtHello,
    /// Refused with an alert after its ClientHello by its tenant's quota.
    Quota,
}

impl Refusal {
    /// Every refusal, for the metric's labels.
    pub const ALL: [Refusal; 3] = [Refusal::AtAccept, Refusal::AtHello, Refusal::Quota];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::AtAccept => "overload_at_accept",
            Refusal::AtHello => "overload_at_hello",
            Refusal::Quota => "tenant_quota",
        }
    }
}

/// A connection taken on: counted as handshake work until dropped.
pub struct Ticket {
    admission: Rc<Admission>,
    /// Counts in the cost measurement when dropped (it did a handshake's work).
    worked: bool,
    /// Its ClientHello was read and its handshake taken on.
    read: bool,
    /// Taken on within its tenant's committed rate: in its line.
    within: Option<Line>,
    /// Taken on at accept only for what is ahead of it whoever's it is (see
    /// [`Admission::at_accept`]): the work taken on was not weighed against a
    /// resumption's room, and is at its ClientHello.
    relaxed: bool,
}

impl Ticket {
    /// Gives the room back while the returned guard lives: for a handshake waiting on its
    /// tenant's quota, which is no work ahead of anyone while it sleeps (else a tenant
    /// flooding beyond its quota would fill the bound with sleepers and get the others
    /// reset at accept).
    pub fn aside(&self) -> Aside<'_> {
        self.admission.count(self.read, self.within, -1);
        Aside(self)
    }

    /// Gives the room back without counting as a handshake done: a connection refused
    /// after its ClientHello, or passed through untouched.
    pub fn cancel(mut self) {
        self.worked = false;
    }
}

/// See [`Ticket::aside`].
pub struct Aside<'a>(&'a Ticket);

impl Drop for Aside<'_> {
    fn drop(&mut self) {
        self.0.admission.count(self.0.read, self.0.within, 1);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let a = &self.admission;
        a.count(self.read, self.within, -1);
        // A connection that ended unread (its client went away) did no handshake.
        if self.worked && self.read {
            let mut w = a.window.get();
            w.finished += 1;
            a.window.set(w);
        }
    }
}

impl Admission {
    /// `bound`: `limits.handshake_queue`, zero for none; `flush_tasks`: the worker
    /// engine's [`Engine::flush_task_time`](terminus_engine::Engine::flush_task_time).
    pub fn new(bound: Duration, flush_tasks: impl Fn() -> Duration + 'static) -> Rc<Self> {
        Rc::new(Self {
            bound: (!bound.is_zero()).then_some(bound),
            unread: Cell::new(0),
            working: Cell::new(0),
            lines: Default::default(),
            went_on: Cell::new(1.0),
            cost: Cell::new(FIRST_COST),
            window: Cell::new(Window {
                started: Instant::now(),
                parked: terminus_engine::parked_time(),
                handshake_time: flush_tasks(),
                working: 0,
                finished: 0,
                refused: 0,
                refused_read: 0,
            }),
            shedding: Cell::new(false),
            busy: Cell::new(0.0),
            handshakes: BusyTime::default(),
            flush_tasks: Box::new(flush_tasks),
        })
    }

    /// Runs `work` (pinned), handshake work (accepting, a connection up to the end of its
    /// handshake), counting its time into the cost per handshake. Unmetered when
    /// admission control is off, since nothing reads it then.
    pub fn metered<F: Future + Unpin>(&self, work: F) -> Metered<'_, F> {
        if self.bound.is_none() {
            return Metered::unmetered(work);
        }
        self.handshakes.metered(work)
    }

    /// The time of all handshake work so far.
    fn handshake_time(&self) -> Duration {
        self.handshakes.spent() + (self.flush_tasks)()
    }

    /// Whether admission control is on: the accept loop then drains the listen queue
    /// each time it runs, since every connection beyond the bound costs only a reset.
    pub fn bounded(&self) -> bool {
        self.bound.is_some()
    }

    /// Takes on a connection just accepted, or says to reset it: when the time it waited
    /// in the listen queue (`waited`, asked for only when bounded) and the work taken on
    /// before it (its own included) go beyond the bound, it would be answered too late.
    /// Where `quotas` says some host's tenant has a quota, only what is ahead of it
    /// whoever's it is counts (see the module docs): the wait, reading the connections
    /// taken on before it, and its own handshake, unless refusing costs too much.
    /// Up to a quarter more is read, for a resumption's sake (see
    /// [`Admission::at_hello`]), where `resumable` says a session can be resumed at all
    /// and unless refusing ClientHellos has come to cost too much.
    pub fn at_accept(
        self: &Rc<Self>,
        waited: impl FnOnce() -> Duration,
        resumable: impl FnOnce() -> bool,
        quotas: impl FnOnce() -> bool,
    ) -> Option<Ticket> {
        self.roll();
        let mut relaxed = false;
        if let Some(bound) = self.bound {
            let waited = waited();
            let mut ahead = waited + self.work() + self.cost.get().mul_f64(self.went_on.get());
            if ahead > bound && !self.shedding.get() && quotas() {
                let reading = REFUSAL_COST * self.unread.get();
                // Beyond even a resumption's room, all the work taken on is weighed at
                // its ClientHello instead, once it is known whose handshake it is.
                relaxed = ahead > bound.mul_f64(RESUMPTION_ROOM);
                ahead = ahead.min(waited + reading + self.cost.get());
            }
            let over = ahead.as_secs_f64() / bound.as_secs_f64();
            // The room beyond the bound is asked about only for connections in it.
            if over > 1.0 && (self.shedding.get() || over > RESUMPTION_ROOM || !resumable()) {
                self.refused();
                return None;
            }
        }
        self.count(false, None, 1);
        Some(Ticket {
            admission: self.clone(),
            worked: true,
            read: false,
            within: None,
            relaxed,
        })
    }

    /// Keeps `ticket` for a handshake whose ClientHello was read (`resumption`: it asks
    /// to resume), or refuses a full handshake beyond the bound, the room above it being
    /// the resumptions'. `within`: its tenant's line, where its quota admitted it at
    /// once, as committed capacity: what is ahead of it is then counted in the lines
    /// (see the module docs). A resumption was weighed against its room at accept,
    /// unless it was taken on there only for what is ahead of it whoever's it is: then
    /// here (else, while some host has a quota, a reconnect storm or a client replaying
    /// a ticket would be taken on without bound).
    pub fn at_hello(
        &self,
        mut ticket: Ticket,
        resumption: bool,
        within: Option<Line>,
    ) -> Option<Ticket> {
        self.roll();
        let fits = self.bound.is_none_or(|bound| match resumption {
            false => self.fits(within, true, bound),
            true => !ticket.relaxed || self.fits(within, true, bound.mul_f64(RESUMPTION_ROOM)),
        });
        if fits {
            self.count(false, None, -1);
            self.count(true, within, 1);
            ticket.read = true;
            ticket.within = within;
            return Some(ticket);
        }
        self.turned_away(ticket);
        None
    }

    /// Whether a handshake taken on as a resumption, which turned out a full one (rustls
    /// declined its ticket), fits within the bound: the room beyond it is resumptions'.
    /// `within`: its tenant's line, where it was taken on within its committed rate.
    pub fn fits_full(&self, within: Option<Line>) -> bool {
        self.bound
            .is_none_or(|bound| self.fits(within, false, bound))
    }

    /// Whether a handshake (in `within`, its tenant's line, if any) fits in `room`, the
    /// bound or a resumption's room beyond it; `unread`: it is still counted as a
    /// connection not read yet, and from here on as a whole handshake. In a line, what
    /// is ahead of it in the lines fits, and all the handshakes under way fit under
    /// [`LINES_CEILING`] times the room; in none, all the work taken on fits.
    fn fits(&self, within: Option<Line>, unread: bool, room: Duration) -> bool {
        let cost = self.cost.get();
        match within {
            Some(line) => {
                let under_way = cost * (self.working.get() + u32::from(unread));
                self.ahead_in(line, u32::from(unread)) <= room
                    && under_way <= room.mul_f64(LINES_CEILING)
            }
            None if unread => self.work() + cost.mul_f64(1.0 - self.went_on.get()) <= room,
            None => self.work() <= room,
        }
    }

    /// Counts a connection refused after its ClientHello (here, or by its tenant's
    /// quota): its room is given back, and it counts as a refusal's cost, not as a
    /// handshake done (cheap refusals counted as handshakes would make the measured
    /// cost per handshake, and so the bound, a fraction of the truth under a flood).
    pub fn turned_away(&self, ticket: Ticket) {
        let mut w = self.window.get();
        w.refused += 1;
        w.refused_read += 1;
        self.window.set(w);
        ticket.cancel();
    }

    /// Whether the worker has capacity nobody is using: it slept at least a tenth of its
    /// last measured window.
    pub fn idle(&self) -> bool {
        self.roll();
        self.busy.get() < IDLE_BELOW
    }

    fn refused(&self) {
        let mut w = self.window.get();
        w.refused += 1;
        self.window.set(w);
    }

    /// The work taken on: the handshakes under way, and the connections not read yet as
    /// the share of one that they probably are.
    fn work(&self) -> Duration {
        let handshakes = self.working.get() as f64 + self.unread.get() as f64 * self.went_on.get();
        self.cost.get().mul_f64(handshakes)
    }

    /// The work ahead of a handshake in `line`, `more` of them not counted in it yet (its
    /// own): its line's handshakes, and of each other line's as many as the fair queue
    /// serves while it serves those (its weight against `line`'s), as the worker serves
    /// them all in its time (generalized processor sharing).
    fn ahead_in(&self, line: Line, more: u32) -> Duration {
        let lines = self.lines.borrow();
        let own = f64::from(more)
            + lines
                .iter()
                .find(|(l, _)| l.id == line.id)
                .map_or(0.0, |&(_, n)| f64::from(n));
        let others: f64 = lines
            .iter()
            .filter(|(l, _)| l.id != line.id)
            .map(|&(l, n)| f64::from(n).min(own * l.weight / line.weight))
            .sum();
        self.cost.get().mul_f64(own + others)
    }

    /// Counts a ticket in (`by` 1) or out (-1) of the handshakes under way (`read`; those
    /// `within` their tenant's committed rate in its line too) or the connections not
    /// read yet.
    fn count(&self, read: bool, within: Option<Line>, by: i32) {
        let n = if read { &self.working } else { &self.unread };
        n.set(n.get().wrapping_add_signed(by));
        let Some(line) = within.filter(|_| read) else {
            return;
        };
        let mut lines = self.lines.borrow_mut();
        match lines.iter().position(|(l, _)| l.id == line.id) {
            Some(i) => {
                let n = lines[i].1.wrapping_add_signed(by);
                if n == 0 {
                    lines.swap_remove(i);
                } else {
                    lines[i] = (line, n);
                }
            }
            None if by > 0 => lines.push((line, 1)),
            None => debug_assert!(false, "a line's handshake counted out twice"),
        }
    }

    /// Ends the measurement window once it is over: how much the worker slept, a new cost
    /// from the time it spent on handshakes per handshake finished in it (and half of one
    /// per handshake begun in it and still under way), and whether refusals at
    /// the ClientHello cost too much to go on reading them.
    fn roll(&self) {
        let w = self.window.get();
        let now = Instant::now();
        let elapsed = now.duration_since(w.started);
        if elapsed < WINDOW {
            return;
        }
        let parked = terminus_engine::parked_time();
        let slept = parked.saturating_sub(w.parked);
        self.busy
            .set(1.0 - slept.as_secs_f64() / elapsed.as_secs_f64().max(1e-9));
        let handshake_time = self.handshake_time();
        if self.bound.is_some() {
            let refusing = REFUSAL_COST * w.refused;
            if w.finished >= 8 {
                let on_handshakes = handshake_time.saturating_sub(w.handshake_time);
                // The window's handshake time went to the ones finished in it and to the
                // ones begun in it and still under way (halfway through, on average):
                // charging it all to the finished ones made a burst of 600 handshakes
                // look ten times dearer than it was, and refused some of them.
                let begun = self.working.get().saturating_sub(w.working);
                let sample = on_handshakes
                    .saturating_sub(refusing)
                    .div_f64(f64::from(w.finished) + f64::from(begun) / 2.0);
                // Weighted toward the past: one odd window moves it a little.
                self.cost.set((self.cost.get() * 7 + sample * 3) / 10);
            }
            let read = w.finished + w.refused_read;
            if read >= 8 {
                let sample = f64::from(w.finished) / f64::from(read);
                self.went_on.set(self.went_on.get() * 0.7 + sample * 0.3);
            }
            self.shedding
                .set(refusing.as_secs_f64() > elapsed.as_secs_f64() * REFUSAL_SHARE);
        }
        self.window.set(Window {
            started: now,
            parked,
            handshake_time,
            working: self.working.get(),
            finished: 0,
            refused: 0,
            refused_read: 0,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread_cpu() -> Duration {
        terminus_sys::thread_cpu_time().unwrap_or_default()
    }

    fn take(admission: &Rc<Admission>, n: usize) -> Vec<Ticket> {
        (0..n)
            .map(|i| {
                admission
                    .at_accept(|| Duration::ZERO, || true, || false)
                    .unwrap_or_else(|| panic!("connection {i} reset"))
            })
            .collect()
    }

    /// `n` connections taken on and read: full handshakes under way.
    fn under_way(admission: &Rc<Admission>, n: usize) -> Vec<Ticket> {
        take(admission, n)
            .into_iter()
            .map(|t| {
                admission
                    .at_hello(t, false, None)
                    .expect("within the bound")
            })
            .collect()
    }

    /// Room for `bound / FIRST_COST` handshakes until a measurement says otherwise, and
    /// a quarter more for resumptions.
    #[test]
    fn full_handshakes_are_taken_on_up_to_the_bound_and_resumptions_a_quarter_beyond() {
        let admission = Admission::new(FIRST_COST * 20, Duration::default);
        let full: Vec<Ticket> = take(&admission, 20)
            .into_iter()
            .map(|t| {
                admission
                    .at_hello(t, false, None)
                    .expect("within the bound")
            })
            .collect();
        // Read, for they could be resumptions; the full one is refused after its hello.
        let mut extra = take(&admission, 5);
        assert!(
            admission
                .at_accept(|| Duration::ZERO, || true, || false)
                .is_none(),
            "a quarter more only"
        );
        assert!(admission
            .at_hello(extra.pop().unwrap(), false, None)
            .is_none());
        let resumed: Vec<Ticket> = extra
            .into_iter()
            .map(|t| {
                admission
                    .at_hello(t, true, None)
                    .expect("a resumption's room")
            })
            .collect();
        drop(resumed);
        drop(full.into_iter().next());
        let next = admission
            .at_accept(|| Duration::ZERO, || true, || false)
            .expect("room again");
        assert!(
            admission.at_hello(next, false, None).is_some(),
            "a finished one made room"
        );
    }

    /// Refusals after a ClientHello (a tenant's quota, or the bound) are not handshakes
    /// done: counted as such, a flood of cheap refusals would make the measured cost per
    /// handshake a fraction of the truth and the worker admit many times what it can do.
    #[test]
    fn refusals_after_the_hello_do_not_dilute_the_cost_per_handshake() {
        let admission = Admission::new(Duration::from_secs(1), Duration::default);
        let done = under_way(&admission, 8);
        let refused = take(&admission, 200);
        spin_handshake_work(&admission, Duration::from_millis(40));
        drop(done);
        for ticket in refused {
            admission.turned_away(ticket);
        }
        std::thread::sleep(WINDOW);
        admission.roll();
        // 40 ms less 200 refusals' 4 ms over 8 handshakes: 4.5 ms, weighted 3 in 10
        // against the 0.5 ms assumed first: 1.7 ms. Over 208, it would be 0.5 ms.
        let cost = admission.cost.get();
        assert!(cost > Duration::from_millis(1), "{cost:?}");
    }

    /// Handshakes begun in a window and still under way at its end had part of its time:
    /// a burst of 300 with 8 finished is not charged as if the 8 had taken it all (which
    /// made 600 concurrent RSA handshakes look ten times dearer and refused some).
    #[test]
    fn a_burst_still_under_way_shares_the_windows_cost() {
        let admission = Admission::new(Duration::from_secs(1), Duration::default);
        let done = under_way(&admission, 8);
        let going = under_way(&admission, 292);
        spin_handshake_work(&admission, Duration::from_millis(40));
        drop(done);
        std::thread::sleep(WINDOW);
        admission.roll();
        // 40 ms over 8 finished and 292 halfway: 0.26 ms, weighted 3 in 10 against the
        // 0.5 ms assumed first: 0.43 ms. Over the 8 alone: 5 ms, and 1.85 ms weighted.
        let cost = admission.cost.get();
        assert!(cost < FIRST_COST, "{cost:?}");
        drop(going);
    }

    /// Spends `cpu` of this thread's time as handshake work (metered).
    fn spin_handshake_work(admission: &Admission, cpu: Duration) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let work = std::pin::pin!(async {
            let until = thread_cpu() + cpu;
            while thread_cpu() < until {
                std::hint::black_box(0u64);
            }
        });
        runtime.block_on(admission.metered(work));
    }

    /// What the thread spends outside handshake work (requests on established
    /// connections) is no handshake's cost: 40 ms of it beside 8 handshakes that took
    /// nothing measured leaves the cost below the first assumption, not at 5 ms each.
    #[test]
    fn work_outside_handshakes_is_not_charged_to_them() {
        let admission = Admission::new(Duration::from_secs(1), Duration::default);
        let done = under_way(&admission, 8);
        let until = thread_cpu() + Duration::from_millis(40);
        while thread_cpu() < until {
            std::hint::black_box(0u64);
        }
        drop(done);
        std::thread::sleep(WINDOW);
        admission.roll();
        let cost = admission.cost.get();
        assert!(cost < FIRST_COST, "{cost:?}");
    }

    /// While most ClientHellos read are refused (a tenant flooding beyond its quota), a
    /// connection not read yet is a fraction of a handshake, and a read one a whole.
    #[test]
    fn connections_not_read_yet_weigh_what_read_ones_turned_out_to_be() {
        let admission = Admission::new(FIRST_COST * 20, Duration::default);
        for _ in 0..5 {
            for ticket in take(&admission, 10) {
                admission.turned_away(ticket);
            }
            std::thread::sleep(WINDOW);
            admission.roll();
        }
        // 0.7^5 (0.168) of a handshake each: 60 are about 10 (at 1 each, 20 fill it).
        let unread = take(&admission, 60);
        let read: Vec<Ticket> = unread
            .into_iter()
            .map_while(|t| admission.at_hello(t, false, None))
            .collect();
        // k read and 60 - k not: k + 0.168 (60 - k) <= 20 up to k = 11.
        assert_eq!(read.len(), 11, "read ones that fit the bound of 20");
    }

    /// A tenant flooding past its committed rate fills the bound with its admitted
    /// handshakes: a connection that may be another tenant's is still taken on where some
    /// host has a quota (reset without), and a handshake within its tenant's committed
    /// rate still admitted after its ClientHello; one past its tenant's is refused.
    #[test]
    fn handshakes_past_their_tenants_committed_rate_are_not_ahead_of_those_within() {
        let admission = Admission::new(FIRST_COST * 20, Duration::default);
        let flood = under_way(&admission, 20);
        let zero = || Duration::ZERO;
        assert!(
            admission.at_accept(zero, || false, || false).is_none(),
            "no quotas: the bound is full"
        );
        let next = admission
            .at_accept(zero, || false, || true)
            .expect("it may be a handshake within its tenant's committed rate");
        assert!(
            admission.at_hello(next, false, None).is_none(),
            "past its tenant's committed rate: the bound is full"
        );
        let b = Line {
            id: 2,
            weight: 100.0,
        };
        let next = admission.at_accept(zero, || false, || true).unwrap();
        assert!(admission.at_hello(next, false, Some(b)).is_some());
        drop(flood);
    }

    /// Within their committed rates, tenants' handshakes are ahead of each other as the
    /// engine's fair queue serves them: a tenant with 20 under way (the bound's worth) is
    /// ahead of a new one of a tenant of a third its weight by three of them, not twenty;
    /// its own next one is refused, and so is the other's once its own line is long.
    #[test]
    fn within_committed_rates_tenants_are_ahead_of_each_other_by_their_weights() {
        let admission = Admission::new(FIRST_COST * 20, Duration::default);
        let (a, b) = (
            Line {
                id: 1,
                weight: 300.0,
            },
            Line {
                id: 2,
                weight: 100.0,
            },
        );
        let hello = |line| {
            let ticket = admission.at_accept(|| Duration::ZERO, || false, || true)?;
            admission.at_hello(ticket, false, Some(line))
        };
        let a_line: Vec<Ticket> = (0..20).map_while(|_| hello(a)).collect();
        assert_eq!(a_line.len(), 20);
        assert!(hello(a).is_none(), "a's line is full");
        // b's k-th: k of its own and min(20, 3k) of a's ahead, up to 20: k = 5.
        let b_line: Vec<Ticket> = (0..20).map_while(|_| hello(b)).collect();
        assert_eq!(b_line.len(), 5, "b's handshakes that fit beside a's 20");
        drop(a_line);
        assert!(hello(b).is_some(), "a's line gone, b's has room");
        drop(b_line);
    }

    /// Where some host has a quota a connection is taken on at accept for what is ahead
    /// of it whoever's it is; resumptions are still held to their quarter beyond the
    /// bound, at their ClientHello: a reconnect storm (or a client replaying a ticket)
    /// of 200 against a bound of 20 gets 25 taken on, with quotas or without.
    #[test]
    fn resumptions_are_held_to_their_room_with_quotas_as_without() {
        for quotas in [false, true] {
            let admission = Admission::new(FIRST_COST * 20, Duration::default);
            let resumed: Vec<Ticket> = (0..200)
                .filter_map(|_| {
                    let ticket = admission.at_accept(|| Duration::ZERO, || true, || quotas)?;
                    admission.at_hello(ticket, true, None)
                })
                .collect();
            assert_eq!(resumed.len(), 25, "resumptions taken on, quotas: {quotas}");
            // In a tenant's line, the quarter beyond the bound is its line's.
            let line = Line {
                id: 1,
                weight: 100.0,
            };
            let in_line: Vec<Ticket> = (0..200)
                .filter_map(|_| {
                    let ticket = admission.at_accept(|| Duration::ZERO, || true, || quotas)?;
                    admission.at_hello(ticket, true, Some(line))
                })
                .collect();
            let expected = if quotas { 25 } else { 0 };
            assert_eq!(in_line.len(), expected, "in a line, quotas: {quotas}");
        }
    }

    /// Each line's count leaves out heavier lines that came after it: ten tenants with
    /// doubling weights, lightest first, each as many handshakes as fit, had 114 under
    /// way against a bound of 20. All the work taken on stays within twice the bound.
    #[test]
    fn tenants_lines_together_stay_within_twice_the_bound() {
        let admission = Admission::new(FIRST_COST * 20, Duration::default);
        let mut under_way = Vec::new();
        for id in 0..10 {
            let line = Line {
                id,
                weight: f64::from(1 << id),
            };
            under_way.extend((0..100).map_while(|_| {
                let ticket = admission.at_accept(|| Duration::ZERO, || false, || true)?;
                admission.at_hello(ticket, false, Some(line))
            }));
        }
        assert_eq!(
            under_way.len(),
            40,
            "handshakes under way against a bound of 20"
        );
    }

    #[test]
    fn a_ticket_set_aside_makes_room_until_it_is_back() {
        let admission = Admission::new(FIRST_COST * 20, Duration::default);
        let held = take(&admission, 20);
        assert!(admission
            .at_accept(|| Duration::ZERO, || false, || false)
            .is_none());
        let aside = held[0].aside();
        let next = admission
            .at_accept(|| Duration::ZERO, || false, || false)
            .expect("the room set aside");
        drop(aside);
        assert!(
            admission.at_hello(next, false, None).is_none(),
            "over again"
        );
        drop(held);
        assert!(admission
            .at_accept(|| Duration::ZERO, || false, || false)
            .is_some());
    }

    #[test]
    fn without_resumption_nothing_beyond_the_bound_is_read() {
        let admission = Admission::new(FIRST_COST * 20, Duration::default);
        let _held = take(&admission, 20);
        assert!(
            admission
                .at_accept(|| Duration::ZERO, || false, || false)
                .is_none(),
            "no session can be resumed: a reset now, not a refusal after its hello"
        );
        assert!(admission
            .at_accept(|| Duration::ZERO, || true, || false)
            .is_some());
    }

    #[test]
    fn a_connection_that_waited_out_the_bound_is_reset_at_accept() {
        let admission = Admission::new(FIRST_COST * 20, Duration::default);
        assert!(admission
            .at_accept(|| FIRST_COST * 19, || true, || false)
            .is_some());
        assert!(
            admission
                .at_accept(|| FIRST_COST * 30, || true, || false)
                .is_none(),
            "waited longer than the bound and its quarter"
        );
        let _held = take(&admission, 10);
        assert!(
            admission
                .at_accept(|| FIRST_COST * 15, || true, || false)
                .is_none(),
            "waited less than the bound, but the work ahead of it adds up to more"
        );
    }

    #[test]
    fn a_costly_flood_of_refusals_turns_to_resets_at_accept_beyond_the_bound() {
        let admission = Admission::new(FIRST_COST * 4, Duration::default);
        let held = under_way(&admission, 4);
        // More refusals after a ClientHello in a window than REFUSAL_SHARE of it pays for.
        let over = (WINDOW.as_secs_f64() * REFUSAL_SHARE / REFUSAL_COST.as_secs_f64()) as u32 + 1;
        for _ in 0..over {
            let ticket = admission
                .at_accept(|| Duration::ZERO, || true, || false)
                .expect("read: the quarter");
            assert!(admission.at_hello(ticket, false, None).is_none());
        }
        std::thread::sleep(WINDOW);
        assert!(
            admission
                .at_accept(|| Duration::ZERO, || true, || false)
                .is_none(),
            "shedding: no quarter to read into"
        );
        drop(held);
        assert!(
            admission
                .at_accept(|| Duration::ZERO, || true, || false)
                .is_some(),
            "room again"
        );
    }

    #[test]
    fn no_bound_takes_everything() {
        let admission = Admission::new(Duration::ZERO, Duration::default);
        let held = take(&admission, 10_000);
        assert_eq!(held.len(), 10_000);
        assert!(!admission.bounded());
    }
}
