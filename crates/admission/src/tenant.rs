//! Tenants: whose crypto capacity a handshake uses, their quotas and their accounts.
//!
//! A tenant's quota is in ACU per second, the way appliances partition crypto capacity
//! (NetScaler SDX's ACU, QAT's committed and peak rates): `acu` is committed, always
//! there; up to `acu_peak` is borrowed, and only while the worker deciding has capacity
//! nobody else is using. A new handshake is admitted against the quota before its first
//! crypto request ([`TenantAccount::admit`]), charged what it will probably cost; each
//! request the engine then computes is charged what it costs on this machine
//! ([`AcuCosts`]), and the estimate is settled against that when the handshake ends
//! ([`Hold`]). So the quota holds in ACU exactly, over any mix of key types: a tenant on
//! ECDSA gets many more handshakes from it than one on RSA-4096.
//!
//! Beyond the quota, a tenant's `over_quota` says what happens: `queue` waits until the
//! committed rate has room for it, if that is within its bound, and is refused at once
//! otherwise (the meters know the wait up front: nobody waits only to be refused);
//! `refuse` refuses at once; `prefer_cheap` refuses at once the handshakes that would
//! sign with RSA and queues the cheap ones (resumptions, ECDSA). terminus signs with
//! ECDSA whenever the client takes it, over quota or not.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use terminus_metrics::Buckets;

use terminus_capacity::{operation, AcuCosts};
use terminus_engine::cost::Operation;
use terminus_engine::{KeyAlgorithm, OpKind, Payer};

use crate::bound::Line;
use crate::meter::Meter;

/// How much of a quota may be used at once, as time at its rate.
const BURST: f64 = 0.1;

/// What a tenant's handshakes beyond its quota get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverQuota {
    /// Wait for the committed rate up to the bound, refused at once beyond it.
    Queue,
    /// Refused at once.
    Refuse,
    /// Handshakes that would sign with RSA refused at once, cheap ones queued.
    PreferCheap,
}

impl OverQuota {
    /// Every action, as configuration files name them.
    pub const NAMES: [&'static str; 3] = ["queue", "refuse", "prefer_cheap"];

    /// The action `name` is, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "queue" => Some(Self::Queue),
            "refuse" => Some(Self::Refuse),
            "prefer_cheap" => Some(Self::PreferCheap),
            _ => None,
        }
    }

    /// Its configuration name.
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// A tenant's share of the machine's crypto capacity.
#[derive(Debug, Clone, PartialEq)]
pub struct Quota {
    /// Committed ACU per second.
    pub acu: f64,
    /// Most ACU per second, borrowing included (at least `acu`).
    pub acu_peak: f64,
    /// Bulk encryption, Mbps (SCU), if limited.
    pub scu: Option<f64>,
    /// What handshakes beyond the quota get.
    pub over_quota: OverQuota,
    /// The longest a queued handshake waits.
    pub max_wait: Duration,
}

/// Why a tenant's handshake was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaRefusal {
    /// `over_quota = "refuse"`, beyond the quota.
    OverQuota,
    /// It would have waited longer than the bound.
    QueueFull,
    /// `over_quota = "prefer_cheap"`, beyond the quota, and it would sign with RSA.
    Expensive,
}

impl QuotaRefusal {
    /// Every cause, in metrics order.
    pub const ALL: [QuotaRefusal; 3] = [Self::OverQuota, Self::QueueFull, Self::Expensive];

    /// The cause's metrics label.
    pub fn name(self) -> &'static str {
        match self {
            Self::OverQuota => "over_quota",
            Self::QueueFull => "queue_full",
            Self::Expensive => "expensive",
        }
    }
}

/// Whose capacity a handshake used: within the committed rate, borrowed, or a tenant
/// without a quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Within the committed rate.
    Committed,
    /// Beyond it, from capacity nobody else was using.
    Borrowed,
    /// A tenant without a quota (accounted only).
    Unmetered,
}

impl Class {
    /// Every class, in metrics order.
    pub const ALL: [Class; 3] = [Class::Committed, Class::Borrowed, Class::Unmetered];

    /// The class's metrics label.
    pub fn name(self) -> &'static str {
        match self {
            Class::Committed => "committed",
            Class::Borrowed => "borrowed",
            Class::Unmetered => "unmetered",
        }
    }
}

/// What a new handshake is, for its admission.
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    /// Its probable cost in ACU ([`TenantAccount::estimate`]).
    pub estimate: f64,
    /// It is cheap: a resumption, or signed with ECDSA.
    pub cheap: bool,
    /// The worker deciding has capacity nobody is using: borrowing is allowed.
    pub idle: bool,
}

/// The answer to an arrival.
pub enum Admission {
    /// Go on now.
    Now(Hold),
    /// Go on after waiting this long; the place in line is already taken.
    After(Duration, Hold),
    /// Refuse it.
    Refused(QuotaRefusal),
}

/// The fair-queueing weight of unmetered tenants when the quotas commit the whole machine:
/// they still get a line of their own, a short one.
pub const UNMETERED_WEIGHT: f64 = 1.0;

/// The tenants of a server, by name, with the cost table they are charged by. Shared by
/// every worker and kept across reloads, so that a reload does not reset what a tenant
/// has used.
pub struct Tenants {
    costs: Arc<RwLock<Arc<AcuCosts>>>,
    accounts: Mutex<HashMap<Arc<str>, Arc<TenantAccount>>>,
    /// The committed ACU of every account with a quota (bits of an f64): what is left of
    /// the machine is the unmetered tenants' weight in fair queueing.
    allocated: Arc<AtomicU64>,
}

impl Tenants {
    /// No tenants yet; charged by `costs`.
    pub fn new(costs: AcuCosts) -> Self {
        Self {
            costs: Arc::new(RwLock::new(Arc::new(costs))),
            accounts: Mutex::new(HashMap::new()),
            allocated: Arc::default(),
        }
    }

    /// Sums the committed quotas again after `accounts` changed.
    fn reallocate(&self, accounts: &HashMap<Arc<str>, Arc<TenantAccount>>) {
        let sum: f64 = accounts
            .values()
            .filter_map(|a| a.quota().map(|q| q.acu))
            .sum();
        self.allocated.store(sum.to_bits(), Ordering::Relaxed);
    }

    /// The cost table every tenant is charged by.
    pub fn costs(&self) -> Arc<AcuCosts> {
        self.costs.read().expect("costs lock").clone()
    }

    /// Replaces the cost table (operations measured after a reload).
    pub fn set_costs(&self, costs: AcuCosts) {
        *self.costs.write().expect("costs lock") = Arc::new(costs);
    }

    /// The account of `name`, made or updated to `quota` (None: accounted, not limited).
    pub fn account(&self, name: &str, quota: Option<Quota>) -> Arc<TenantAccount> {
        let mut accounts = self.accounts.lock().expect("tenants lock");
        let account = match accounts.get(name) {
            Some(account) => {
                account.set_quota(quota);
                account.clone()
            }
            None => {
                let account = Arc::new(TenantAccount::new(
                    name.into(),
                    quota,
                    self.costs.clone(),
                    self.allocated.clone(),
                ));
                accounts.insert(account.name.clone(), account.clone());
                account
            }
        };
        self.reallocate(&accounts);
        account
    }

    /// Forgets every account but `names`' (tenants a reload removed), so that they leave
    /// the capacity table and what is allocated. Handshakes under way keep theirs; a
    /// tenant added back later starts a new account.
    pub fn retain<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        let keep: Vec<&str> = names.into_iter().collect();
        let mut accounts = self.accounts.lock().expect("tenants lock");
        accounts.retain(|name, _| keep.contains(&&**name));
        self.reallocate(&accounts);
    }

    /// The account of `name`, if there is one.
    pub fn get(&self, name: &str) -> Option<Arc<TenantAccount>> {
        self.accounts
            .lock()
            .expect("tenants lock")
            .get(name)
            .cloned()
    }

    /// Every account, by name.
    pub fn all(&self) -> Vec<Arc<TenantAccount>> {
        let mut all: Vec<_> = self
            .accounts
            .lock()
            .expect("tenants lock")
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }
}

/// One tenant: its quota, its meters and what it has used.
pub struct TenantAccount {
    name: Arc<str>,
    costs: Arc<RwLock<Arc<AcuCosts>>>,
    /// See [`Tenants`]'s field.
    allocated: Arc<AtomicU64>,
    /// The meters' clock starts here.
    epoch: Instant,
    state: Mutex<State>,
    /// Micro-ACU charged, by [`Class`].
    used: [AtomicU64; 3],
    /// Micro-ACU asked for: every metered arrival's estimate, admitted or refused (a
    /// fleet shares a quota by it).
    offered: AtomicU64,
    /// Requests computed, by [`Operation`].
    ops: [AtomicU64; Operation::COUNT],
    /// Handshakes admitted, by [`Class`]: by the quota, and then taken on by admission
    /// control ([`Hold::taken_on`]).
    admitted: [AtomicU64; 3],
    /// Handshakes refused, by [`QuotaRefusal`].
    refused: [AtomicU64; 3],
    /// Handshakes waiting for the quota now.
    waiting: AtomicI64,
    /// How long queued handshakes waited.
    waits: Buckets,
    /// Bytes sent by the tenant's connections under an SCU quota.
    bulk_bytes: AtomicU64,
    /// Writes that waited for the SCU quota, and how long in all (µs).
    paced: AtomicU64,
    paced_micros: AtomicU64,
}

struct State {
    quota: Option<Quota>,
    /// This instance's share of the quota, which a fleet's quota is (1 alone).
    share: f64,
    committed: Meter,
    peak: Meter,
    /// Bytes per second of bulk encryption (SCU), when limited.
    scu: Option<Meter>,
    /// ACU charged in the current second of the epoch, and in the one before.
    second: u64,
    this_second: f64,
    last_second: f64,
}

/// Buckets of the quota wait histogram, seconds.
const WAIT_BOUNDS: &[f64] = &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

impl TenantAccount {
    fn new(
        name: Arc<str>,
        quota: Option<Quota>,
        costs: Arc<RwLock<Arc<AcuCosts>>>,
        allocated: Arc<AtomicU64>,
    ) -> Self {
        let (committed, peak) = meters(quota.as_ref(), 1.0);
        Self {
            name,
            costs,
            allocated,
            epoch: Instant::now(),
            state: Mutex::new(State {
                scu: scu_meter(quota.as_ref(), 1.0),
                quota,
                share: 1.0,
                committed,
                peak,
                second: 0,
                this_second: 0.0,
                last_second: 0.0,
            }),
            used: Default::default(),
            offered: AtomicU64::new(0),
            ops: Default::default(),
            admitted: Default::default(),
            refused: Default::default(),
            waiting: AtomicI64::new(0),
            waits: Buckets::new(WAIT_BOUNDS),
            bulk_bytes: AtomicU64::new(0),
            paced: AtomicU64::new(0),
            paced_micros: AtomicU64::new(0),
        }
    }

    fn set_quota(&self, quota: Option<Quota>) {
        let mut st = self.state.lock().expect("tenant lock");
        if st.quota != quota {
            (st.committed, st.peak) = meters(quota.as_ref(), st.share);
            st.scu = scu_meter(quota.as_ref(), st.share);
            st.quota = quota;
        }
    }

    /// Sets this instance's share of the tenant's quota (a fleet's quota, shared by its
    /// instances): the meters run at `share` of the quota's rates from `now`, what was
    /// used ahead of them still owed.
    pub fn set_share(&self, now: Instant, share: f64) {
        let share = share.clamp(1e-6, 1.0);
        let t = now.duration_since(self.epoch).as_secs_f64();
        let mut st = self.state.lock().expect("tenant lock");
        if st.share == share {
            return;
        }
        st.share = share;
        let Some(q) = st.quota.clone() else { return };
        st.committed.rescale(t, q.acu * share);
        st.peak.rescale(t, q.acu_peak.max(q.acu) * share);
        if let (Some(m), Some(scu)) = (st.scu.as_mut(), q.scu) {
            m.rescale(t, scu * 1e6 / 8.0 * share);
        }
    }

    /// The tenant's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name, shared: for labels that outlive a borrow.
    pub fn shared_name(&self) -> Arc<str> {
        self.name.clone()
    }

    /// Its quota, if it has one.
    pub fn quota(&self) -> Option<Quota> {
        self.state.lock().expect("tenant lock").quota.clone()
    }

    /// What a handshake probably costs: a signature with `sign` (none when resuming) and
    /// a key exchange in `group`'s operation.
    pub fn estimate(&self, sign: Option<KeyAlgorithm>, kx: Operation) -> f64 {
        let costs = self.costs.read().expect("costs lock");
        let signature = sign.map_or(0.0, |key| {
            let kind = match key {
                KeyAlgorithm::Rsa { .. } => OpKind::RsaSign,
                _ => OpKind::EcdsaSign,
            };
            costs.request(kind, Some(key))
        });
        signature + costs.of(kx).0
    }

    /// What a request of `kind` (signed with `key`) costs, and the tenant's weight in the
    /// engine's fair queueing: its committed ACU, or without a quota what no quota has
    /// committed of the machine (at least [`UNMETERED_WEIGHT`]). Weighed as the whole
    /// machine, unmetered traffic would take ~75 times a 20-ACU tenant's share of every
    /// oversubscribed batch: its own handshakes would jump the tenants' paid ones.
    pub fn cost_and_weight(&self, kind: OpKind, key: Option<KeyAlgorithm>) -> (f64, f64) {
        let cost = self.costs.read().expect("costs lock").request(kind, key);
        (cost, self.weight())
    }

    /// The tenant's weight in the engine's fair queueing (see [`Self::cost_and_weight`]).
    pub fn weight(&self) -> f64 {
        let committed = {
            let st = self.state.lock().expect("tenant lock");
            st.quota.as_ref().map(|q| q.acu * st.share)
        };
        let weight = committed.unwrap_or_else(|| {
            let allocated = f64::from_bits(self.allocated.load(Ordering::Relaxed));
            let machine = self.costs.read().expect("costs lock").machine_acu();
            (machine - allocated).max(UNMETERED_WEIGHT)
        });
        weight.max(f64::MIN_POSITIVE)
    }

    /// A handshake admitted as cheap (a resumption) turned out expensive at `now` (rustls
    /// declined its ticket, and it is signing): `Some(Expensive)`, counted, where
    /// `prefer_cheap` would refuse an expensive arrival now (beyond the committed rate,
    /// and nothing to borrow unless `idle`).
    pub fn refuses_expensive(&self, now: Instant, idle: bool) -> Option<QuotaRefusal> {
        let t = now.duration_since(self.epoch).as_secs_f64();
        let st = self.state.lock().expect("tenant lock");
        let quota = st.quota.as_ref()?;
        let within = st.committed.wait(t) == 0.0 || idle && st.peak.wait(t) == 0.0;
        if quota.over_quota != OverQuota::PreferCheap || within {
            return None;
        }
        drop(st);
        let cause = QuotaRefusal::Expensive;
        self.refused[cause as usize].fetch_add(1, Ordering::Relaxed);
        Some(cause)
    }

    /// Admits a new handshake at `now`, or says how long it waits or why it is refused.
    pub fn admit(self: &Arc<Self>, now: Instant, arrival: Arrival) -> Admission {
        let t = now.duration_since(self.epoch).as_secs_f64();
        let mut st = self.state.lock().expect("tenant lock");
        let Some(quota) = st.quota.clone() else {
            drop(st);
            return Admission::Now(self.hold(Class::Unmetered, arrival.estimate));
        };
        let cost = arrival.estimate;
        self.offered
            .fetch_add((cost * 1e6).round() as u64, Ordering::Relaxed);
        if st.committed.wait(t) == 0.0 {
            st.committed.charge(t, cost);
            st.peak.charge(t, cost);
            drop(st);
            return Admission::Now(self.hold(Class::Committed, cost));
        }
        if arrival.idle && st.peak.wait(t) == 0.0 {
            st.peak.charge(t, cost);
            drop(st);
            return Admission::Now(self.hold(Class::Borrowed, cost));
        }
        let refused = match quota.over_quota {
            OverQuota::Refuse => Some(QuotaRefusal::OverQuota),
            OverQuota::PreferCheap if !arrival.cheap => Some(QuotaRefusal::Expensive),
            OverQuota::Queue | OverQuota::PreferCheap => None,
        };
        // Queued: for the committed rate, or for the peak's while the worker is idle.
        let committed = st.committed.wait(t);
        let peak = if arrival.idle {
            st.peak.wait(t)
        } else {
            f64::INFINITY
        };
        let (wait, class) = if peak < committed {
            (peak, Class::Borrowed)
        } else {
            (committed, Class::Committed)
        };
        let refused =
            refused.or((wait > quota.max_wait.as_secs_f64()).then_some(QuotaRefusal::QueueFull));
        if let Some(cause) = refused {
            drop(st);
            self.refused[cause as usize].fetch_add(1, Ordering::Relaxed);
            return Admission::Refused(cause);
        }
        if class == Class::Committed {
            st.committed.charge(t + wait, cost);
        }
        st.peak.charge(t + wait, cost);
        drop(st);
        let wait = Duration::from_secs_f64(wait);
        self.waits.observe_duration(wait);
        Admission::After(wait, self.hold(class, cost))
    }

    fn hold(self: &Arc<Self>, class: Class, reserved: f64) -> Hold {
        Hold {
            account: self.clone(),
            class,
            reserved,
            used: Cell::new(0.0),
        }
    }

    /// A handshake starts waiting for the quota; it stops when the guard is dropped.
    pub fn waiting(self: &Arc<Self>) -> Waiting {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Waiting(self.clone())
    }

    fn charged(&self, class: Class, op: Operation, cost: f64) {
        self.ops[op as usize].fetch_add(1, Ordering::Relaxed);
        self.used[class as usize].fetch_add((cost * 1e6).round() as u64, Ordering::Relaxed);
        let second = self.epoch.elapsed().as_secs();
        let mut st = self.state.lock().expect("tenant lock");
        st.roll(second);
        st.this_second += cost;
    }

    /// Whether the tenant's bulk encryption is limited (an SCU quota): its connections'
    /// writes are then paced ([`TenantAccount::scu_wait`]).
    pub fn paced(&self) -> bool {
        self.state.lock().expect("tenant lock").scu.is_some()
    }

    /// How long a write of the tenant's must wait at `now` for its SCU quota; zero to go
    /// now (or without an SCU quota). The wait is counted as pacing.
    pub fn scu_wait(&self, now: Instant) -> Duration {
        let t = now.duration_since(self.epoch).as_secs_f64();
        let wait = self
            .state
            .lock()
            .expect("tenant lock")
            .scu
            .map_or(0.0, |m| m.wait(t));
        let wait = Duration::from_secs_f64(wait);
        if !wait.is_zero() {
            self.paced.fetch_add(1, Ordering::Relaxed);
            self.paced_micros
                .fetch_add(wait.as_micros() as u64, Ordering::Relaxed);
        }
        wait
    }

    /// Counts `bytes` of the tenant's sent at `now` against its SCU quota.
    pub fn scu_sent(&self, now: Instant, bytes: usize) {
        let t = now.duration_since(self.epoch).as_secs_f64();
        if let Some(m) = self.state.lock().expect("tenant lock").scu.as_mut() {
            m.charge(t, bytes as f64);
        }
        self.bulk_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// What the tenant has used and been refused so far.
    pub fn usage(&self) -> Usage {
        let second = self.epoch.elapsed().as_secs();
        let mut st = self.state.lock().expect("tenant lock");
        st.roll(second);
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Usage {
            acu_per_s: st.last_second,
            acu: std::array::from_fn(|i| load(&self.used[i]) as f64 / 1e6),
            offered_acu: load(&self.offered) as f64 / 1e6,
            share: st.share,
            ops: std::array::from_fn(|i| load(&self.ops[i])),
            admitted: std::array::from_fn(|i| load(&self.admitted[i])),
            refused: std::array::from_fn(|i| load(&self.refused[i])),
            waiting: self.waiting.load(Ordering::Relaxed).max(0) as u64,
            bulk_bytes: load(&self.bulk_bytes),
            paced_writes: load(&self.paced),
            paced_seconds: load(&self.paced_micros) as f64 / 1e6,
        }
    }

    /// The wait histogram of queued handshakes.
    pub fn waits(&self) -> &Buckets {
        &self.waits
    }
}

impl State {
    /// Moves the per-second window to `second`.
    fn roll(&mut self, second: u64) {
        if second == self.second {
            return;
        }
        self.last_second = if second == self.second + 1 {
            self.this_second
        } else {
            0.0
        };
        self.this_second = 0.0;
        self.second = second;
    }
}

/// An SCU quota (`share` of it) as a meter of bytes per second (1 SCU = 1 Mbps).
fn scu_meter(quota: Option<&Quota>, share: f64) -> Option<Meter> {
    let mbps = quota?.scu?;
    Some(Meter::new(mbps * 1e6 / 8.0 * share, BURST))
}

fn meters(quota: Option<&Quota>, share: f64) -> (Meter, Meter) {
    let (acu, peak) = quota.map_or((1.0, 1.0), |q| (q.acu, q.acu_peak.max(q.acu)));
    (
        Meter::new(acu * share, BURST),
        Meter::new(peak * share, BURST),
    )
}

impl std::fmt::Debug for TenantAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantAccount")
            .field("name", &self.name)
            .field("quota", &self.quota())
            .finish_non_exhaustive()
    }
}

/// A snapshot of a tenant's counters.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    /// ACU charged in the last whole second.
    pub acu_per_s: f64,
    /// ACU charged since start, by [`Class`].
    pub acu: [f64; 3],
    /// ACU asked for since start (estimates of every arrival, admitted or refused).
    pub offered_acu: f64,
    /// This instance's share of the quota.
    pub share: f64,
    /// Requests computed, by [`Operation::ALL`]'s order.
    pub ops: [u64; Operation::COUNT],
    /// Handshakes admitted, by [`Class`]: by the quota, and then taken on by admission
    /// control.
    pub admitted: [u64; 3],
    /// Handshakes refused, by [`QuotaRefusal`].
    pub refused: [u64; 3],
    /// Handshakes waiting for the quota now.
    pub waiting: u64,
    /// Bytes sent under an SCU quota.
    pub bulk_bytes: u64,
    /// Writes that waited for the SCU quota.
    pub paced_writes: u64,
    /// How long they waited, in all.
    pub paced_seconds: f64,
}

/// A handshake admitted against a tenant's quota: its crypto requests are charged to it,
/// and when it ends what they cost replaces the estimate it was admitted at.
pub struct Hold {
    account: Arc<TenantAccount>,
    class: Class,
    reserved: f64,
    used: Cell<f64>,
}

impl Hold {
    /// The tenant's line in admission control, for a handshake admitted as committed
    /// capacity (see [`crate::bound`]).
    pub fn line(&self) -> Option<Line> {
        (self.class == Class::Committed).then(|| Line {
            id: self.id(),
            weight: self.account.weight(),
        })
    }

    /// Counts the handshake admitted, in its class, once admission control has taken it on
    /// too. The quota is asked first (see [`crate::bound`]): a handshake the bound then
    /// refuses, or whose deadline passes while it waits for the quota, was not admitted,
    /// and its hold, dropped, gives the quota back.
    pub fn taken_on(&self) {
        self.account.admitted[self.class as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Charges one request of `kind` (signed with `key`) at this machine's cost.
    pub fn charge(&self, kind: OpKind, key: Option<KeyAlgorithm>) {
        let op = operation(kind, key);
        let cost = self.account.costs.read().expect("costs lock").of(op).0;
        self.used.set(self.used.get() + cost);
        self.account.charged(self.class, op, cost);
    }
}

/// The engine orders a handshake's requests by its tenant's weight and charges the
/// tenant what they cost.
impl Payer for Hold {
    fn id(&self) -> usize {
        Arc::as_ptr(&self.account) as usize
    }

    fn cost_and_weight(&self, kind: OpKind, key: Option<KeyAlgorithm>) -> (f64, f64) {
        self.account.cost_and_weight(kind, key)
    }

    fn borrowed(&self) -> bool {
        self.class == Class::Borrowed
    }

    fn charge(&self, kind: OpKind, key: Option<KeyAlgorithm>) {
        Hold::charge(self, kind, key);
    }
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("tenant", &self.account.name)
            .field("class", &self.class)
            .field("reserved", &self.reserved)
            .field("used", &self.used.get())
            .finish()
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let correction = self.used.get() - self.reserved;
        if correction == 0.0 || self.class == Class::Unmetered {
            return;
        }
        let mut st = self.account.state.lock().expect("tenant lock");
        if self.class == Class::Committed {
            st.committed.adjust(correction);
        }
        st.peak.adjust(correction);
    }
}

/// A handshake waiting for its tenant's quota; see [`TenantAccount::waiting`].
pub struct Waiting(Arc<TenantAccount>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tenant without a quota weighs what the quotas leave of the machine in fair
    /// queueing, not all of it (which would give it ~75 times a 20-ACU tenant's share of
    /// an oversubscribed engine), and a line of its own when the quotas take everything.
    #[test]
    fn unmetered_traffic_weighs_the_capacity_nobody_was_promised() {
        let quota = |acu: f64| Quota {
            acu,
            acu_peak: acu,
            scu: None,
            over_quota: OverQuota::Queue,
            max_wait: Duration::from_secs(1),
        };
        let costs = AcuCosts::unmeasured(1);
        let machine = costs.machine_acu();
        let tenants = Tenants::new(costs);
        let paid = tenants.account("paid", Some(quota(machine * 0.2)));
        let unmetered = tenants.account("default", None);
        let weight = |t: &TenantAccount| t.cost_and_weight(OpKind::X25519, None).1;
        assert!((weight(&paid) - machine * 0.2).abs() < 1e-9);
        assert!((weight(&unmetered) - machine * 0.8).abs() < 1e-9);
        // Everything committed: unmetered traffic keeps a small line of its own.
        tenants.account("paid", Some(quota(machine * 2.0)));
        assert_eq!(weight(&unmetered), UNMETERED_WEIGHT);
        // A fleet's share scales a tenant's weight with its quota.
        paid.set_share(Instant::now(), 0.5);
        assert!((weight(&paid) - machine).abs() < 1e-9);
    }

    fn tenants() -> Tenants {
        Tenants::new(AcuCosts::unmeasured(1))
    }

    fn quota(acu: f64, acu_peak: f64, over_quota: OverQuota) -> Quota {
        Quota {
            acu,
            acu_peak,
            scu: None,
            over_quota,
            max_wait: Duration::from_millis(150),
        }
    }

    const RSA: Option<KeyAlgorithm> = Some(KeyAlgorithm::Rsa { bits: 2048 });

    /// RSA-2048 + X25519 handshakes offered at `per_s` for `seconds` of simulated time:
    /// each admitted one is charged its two requests. Returns (ACU charged, refused).
    fn flood(
        account: &Arc<TenantAccount>,
        per_s: f64,
        seconds: f64,
        idle: bool,
        cheap: bool,
    ) -> (f64, u64) {
        let start = Instant::now();
        let before = account.usage();
        let estimate = account.estimate(RSA, Operation::X25519);
        let mut refused = 0;
        for i in 0..(per_s * seconds) as usize {
            let now = start + Duration::from_secs_f64(i as f64 / per_s);
            let arrival = Arrival {
                // Estimated a little high, settled at the true cost.
                estimate: estimate * 1.5,
                cheap,
                idle,
            };
            match account.admit(now, arrival) {
                Admission::Now(hold) | Admission::After(_, hold) => {
                    hold.taken_on();
                    hold.charge(OpKind::X25519, None);
                    hold.charge(OpKind::RsaSign, RSA);
                }
                Admission::Refused(_) => refused += 1,
            }
        }
        let after = account.usage();
        let acu: f64 = (0..3).map(|i| after.acu[i] - before.acu[i]).sum();
        (acu, refused)
    }

    #[test]
    fn every_request_is_charged_its_cost_exactly() {
        let tenants = tenants();
        let account = tenants.account("a", None);
        let Admission::Now(hold) = account.admit(
            Instant::now(),
            Arrival {
                estimate: 1.0,
                cheap: false,
                idle: true,
            },
        ) else {
            panic!("no quota: admitted at once");
        };
        hold.taken_on();
        for _ in 0..3 {
            hold.charge(OpKind::RsaSign, Some(KeyAlgorithm::Rsa { bits: 4096 }));
        }
        for _ in 0..5 {
            hold.charge(OpKind::EcdsaSign, Some(KeyAlgorithm::EcdsaP256));
            hold.charge(OpKind::X25519MlKem768, None);
        }
        let costs = tenants.costs();
        let expected = 3.0 * costs.of(Operation::Rsa4096).0
            + 5.0 * (costs.of(Operation::EcdsaP256).0 + costs.of(Operation::X25519MlKem768).0);
        let usage = account.usage();
        assert!((usage.acu[Class::Unmetered as usize] - expected).abs() < 1e-5);
        assert_eq!(usage.ops[Operation::Rsa4096 as usize], 3);
        assert_eq!(usage.ops[Operation::EcdsaP256 as usize], 5);
        assert_eq!(usage.ops[Operation::X25519MlKem768 as usize], 5);
        assert_eq!(usage.admitted[Class::Unmetered as usize], 1);
    }

    /// The quota is asked before admission control: a handshake it admits that the bound
    /// then refuses (its hold dropped, not taken on) is not counted admitted.
    #[test]
    fn a_handshake_admission_control_refuses_is_not_counted_admitted() {
        let tenants = tenants();
        let account = tenants.account("a", Some(quota(100.0, 100.0, OverQuota::Refuse)));
        let arrival = Arrival {
            estimate: 1.0,
            cheap: false,
            idle: false,
        };
        let now = Instant::now();
        let (Admission::Now(refused), Admission::Now(taken)) =
            (account.admit(now, arrival), account.admit(now, arrival))
        else {
            panic!("within its quota: admitted at once");
        };
        drop(refused);
        taken.taken_on();
        assert_eq!(
            account.usage().admitted,
            [1, 0, 0],
            "committed, borrowed, unmetered"
        );
    }

    #[test]
    fn a_tenant_at_three_times_its_quota_is_held_to_its_peak_while_idle() {
        let tenants = tenants();
        let account = tenants.account("a", Some(quota(100.0, 150.0, OverQuota::Queue)));
        let (acu, refused) = flood(&account, 300.0, 10.0, true, false);
        assert!(
            (1350.0..=1650.0).contains(&acu),
            "{acu:.0} ACU in 10 s at a 150 ACU/s peak"
        );
        assert!(refused > 0);
        let usage = account.usage();
        assert!(usage.admitted[Class::Borrowed as usize] > 0, "it borrowed");
    }

    #[test]
    fn borrowing_happens_only_while_the_worker_is_idle() {
        let tenants = tenants();
        let account = tenants.account("a", Some(quota(100.0, 150.0, OverQuota::Queue)));
        let (acu, _) = flood(&account, 300.0, 10.0, false, false);
        assert!(
            (900.0..=1100.0).contains(&acu),
            "{acu:.0} ACU in 10 s busy: its committed 100 ACU/s only"
        );
        assert_eq!(account.usage().admitted[Class::Borrowed as usize], 0);
    }

    #[test]
    fn a_tenant_within_its_quota_is_never_refused_nor_kept_waiting() {
        let tenants = tenants();
        let account = tenants.account("b", Some(quota(100.0, 100.0, OverQuota::Refuse)));
        let (_, refused) = flood(&account, 45.0, 10.0, false, false);
        assert_eq!(refused, 0);
        assert_eq!(account.waits().count(), 0);
    }

    #[test]
    fn queued_handshakes_wait_at_most_the_bound_and_refuse_doesnt_queue() {
        let tenants = tenants();
        let queue = tenants.account("q", Some(quota(10.0, 10.0, OverQuota::Queue)));
        let refuse = tenants.account("r", Some(quota(10.0, 10.0, OverQuota::Refuse)));
        let now = Instant::now();
        let one = Arrival {
            estimate: 1.0,
            cheap: false,
            idle: false,
        };
        let mut holds = Vec::new();
        let mut waits = Vec::new();
        for _ in 0..10 {
            match queue.admit(now, one) {
                Admission::Now(h) => holds.push(h),
                Admission::After(wait, h) => {
                    waits.push(wait);
                    holds.push(h)
                }
                Admission::Refused(cause) => assert_eq!(cause, QuotaRefusal::QueueFull),
            }
        }
        // The burst (0.1 s = 1 ACU, and the one that opens it), then one each 0.1 s up to
        // the 150 ms bound.
        assert_eq!(holds.len(), 3, "{waits:?}");
        assert!(waits.iter().all(|w| *w <= Duration::from_millis(150)));
        assert_eq!(queue.usage().refused[QuotaRefusal::QueueFull as usize], 7);
        let mut refused = 0;
        for _ in 0..10 {
            match refuse.admit(now, one) {
                Admission::After(..) => panic!("refuse never queues"),
                Admission::Refused(cause) => {
                    assert_eq!(cause, QuotaRefusal::OverQuota);
                    refused += 1;
                }
                // Held: a hold dropped without crypto gives its estimate back.
                Admission::Now(hold) => holds.push(hold),
            }
        }
        assert_eq!(refused, 8);
    }

    #[test]
    fn prefer_cheap_refuses_rsa_at_once_and_queues_cheap_handshakes() {
        let tenants = tenants();
        let account = tenants.account("c", Some(quota(10.0, 10.0, OverQuota::PreferCheap)));
        let now = Instant::now();
        let arrival = |cheap| Arrival {
            estimate: 1.0,
            cheap,
            idle: false,
        };
        let _first: Vec<Hold> = (0..2)
            .map(|_| match account.admit(now, arrival(false)) {
                Admission::Now(h) => h,
                _ => panic!("within the burst"),
            })
            .collect();
        assert!(matches!(
            account.admit(now, arrival(false)),
            Admission::Refused(QuotaRefusal::Expensive)
        ));
        assert!(matches!(
            account.admit(now, arrival(true)),
            Admission::After(..)
        ));
    }

    #[test]
    fn an_estimate_is_settled_at_the_true_cost() {
        let tenants = tenants();
        let account = tenants.account("s", Some(quota(10.0, 10.0, OverQuota::Refuse)));
        let now = Instant::now();
        let high = Arrival {
            estimate: 50.0,
            cheap: false,
            idle: false,
        };
        let Admission::Now(hold) = account.admit(now, high) else {
            panic!("the first is within the burst");
        };
        assert!(matches!(account.admit(now, high), Admission::Refused(_)));
        // It cost nothing after all (it failed before any crypto): all given back.
        drop(hold);
        assert!(matches!(account.admit(now, high), Admission::Now(_)));
    }

    #[test]
    fn a_reload_keeps_the_account_and_what_it_used() {
        let tenants = tenants();
        let a = tenants.account("a", Some(quota(10.0, 10.0, OverQuota::Queue)));
        let Admission::Now(hold) = a.admit(
            Instant::now(),
            Arrival {
                estimate: 1.0,
                cheap: true,
                idle: false,
            },
        ) else {
            panic!("within the burst");
        };
        hold.charge(OpKind::X25519, None);
        let b = tenants.account("a", Some(quota(20.0, 30.0, OverQuota::Refuse)));
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(b.quota().map(|q| q.acu_peak), Some(30.0));
        assert_eq!(b.usage().ops[Operation::X25519 as usize], 1);
        // A reload without tenant c forgets it; tenant a stays as it was.
        tenants.account("c", None);
        tenants.retain(["a"]);
        let names: Vec<String> = tenants.all().iter().map(|t| t.name().to_owned()).collect();
        assert_eq!(names, ["a"]);
        assert!(Arc::ptr_eq(&a, &tenants.account("a", None)));
    }
}
