//! A fleet's quotas: a `[[tenant]]`'s ACU are the fleet's, and each instance enforces its
//! share with its own meters, so that no handshake waits on the store.
//!
//! Every tick (100 ms) an instance reports, per tenant with a quota, the ACU per second
//! its clients asked for and used, and reads every instance's report back, in one
//! pipeline; all instances then compute the same shares from the same reports: a floor
//! (a tenth of the quota split evenly, so an instance that starts seeing a tenant admits
//! it at once) and the rest in proportion to demand. Shares move the meters' rates, never
//! their state (what was used ahead is still owed). An instance that stops reporting is
//! out of the split once its report has not advanced for [`ALIVE`] on the reader's own
//! clock.
//!
//! Reports are in the clear (they need integrity, not secrecy) and authenticated with
//! HMAC-SHA256 under a subkey of the fleet's key file for this purpose alone ([`Kek::subkey`]
//! with [`SUBKEY_INFO`]: not the key that wraps ticket keys, so no volume of reports wears
//! it out), the tenant's entry and the instance's field in what is authenticated: whoever
//! can write to the store without the key file cannot make up an instance or its demand
//! (to push the real ones to the floor), nor move a real report to another field or
//! tenant. A report that does not verify is ignored, counted and deleted. Each carries its
//! writer's time and a sequence number: one written more than [`MAX_AGE`] ago (the writer's
//! clock against the reader's), or stamped more than [`AHEAD`] in the reader's future, or
//! not newer than one already read from its instance, is a replay and keeps no instance
//! alive. A report deleted is no instance gone either: each instance's last authenticated
//! report counts until it is [`ALIVE`] old. Reports of older versions (unsealed, or sealed
//! under the key file as "s1:") are ignored (and deleted) like any that does not verify,
//! and older versions cannot read these: during a rolling upgrade the two versions do not
//! count each other, and the fleet may go over a quota until it is done.
//!
//! ```text
//! {prefix}quota:{tenant}   a hash: field = instance id, value =
//!                          "m1:{demand} {used} {seq} {unix ms}:{tag in hex}", the tag
//!                          HMAC-SHA256 under HKDF-SHA256(key file, SUBKEY_INFO) of
//!                          "terminus:quota-report:v1:{length of the binding}:{binding}"
//!                          and then the report's text, the binding being
//!                          "quota-share:{length of the entry's name}:{entry}:{field}"
//! ```
//!
//! An instance remembers at most [`MAX_INSTANCES`] per tenant (the oldest dropped) and
//! deletes at most [`MAX_DELETES`] fields a round, in one `HDEL` per tenant; the store's
//! thread runs these rounds on a connection of their own, each cut off after
//! [`ROUND_BUDGET`], so that they never hold up the ticket keys. What it reads a round is
//! bounded too: a tenant's hash of more than [`MAX_FIELDS`] fields (only someone writing
//! junk to the store makes one) is read with `HSCAN`, [`MAX_FIELDS`] fields a round, on
//! from where the last round stopped; a field or value longer than any real report's
//! ([`MAX_FIELD`], [`MAX_VALUE`]) is deleted unread.
//!
//! When the store is gone, an instance holds its last shares for [`HOLD`], then falls
//! back to an even split among the instances it last saw: the fleet stays at or under the
//! quota as long as no instance joins meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_lc_rs::hmac;
use redis::aio::MultiplexedConnection;
use redis::RedisResult;
use terminus_metrics::{label_values, Counter, Exposition, Kind, Labelled, Labels, Render};

use crate::tickets::key::{hex, Kek};

/// How often instances report and re-split.
pub const TICK: Duration = Duration::from_millis(100);
/// A report unchanged this long is an instance gone.
pub const ALIVE: Duration = Duration::from_secs(1);
/// How long the last shares hold with the store gone.
pub const HOLD: Duration = Duration::from_secs(3);
/// Instances remembered per tenant: far more than a balancer spreads one tenant over, and
/// a bound on what reports put in the store can cost this instance.
pub const MAX_INSTANCES: usize = 1024;
/// A report written longer ago than this is a replay: live ones are rewritten every
/// tick and gone ones deleted after ten [`ALIVE`]s, so this is the slack left for clocks.
pub const MAX_AGE: Duration = Duration::from_secs(60);
/// Fields deleted a round at most: gone instances' reports, and reports that do not open
/// or are too old.
pub const MAX_DELETES: usize = 256;
/// The longest a share round may take before it is given up (and the shares hold as in an
/// outage).
pub const ROUND_BUDGET: Duration = Duration::from_secs(1);
/// A report stamped further ahead than this on the reader's clock is refused (as stale): a
/// report cannot have been written in the future, and one that would count for long once
/// recorded is a replay kept ready. Instances' clocks must agree within this.
pub const AHEAD: Duration = Duration::from_secs(30);
/// Fields of a tenant's hash beyond which it is read a part a round (with `HSCAN`), not
/// whole: four times the instances remembered.
pub const MAX_FIELDS: usize = 4 * MAX_INSTANCES;
/// Fields asked for per `HSCAN` page when a hash holds more than [`MAX_FIELDS`].
const SCAN_PAGE: usize = MAX_FIELDS / 4;
/// The HKDF info naming the key file's subkey for quota reports.
pub const SUBKEY_INFO: &str = "terminus fleet quota-report v1";
/// What every report's tag is over first: the purpose and format, so that no tag made for
/// anything else under the same subkey passes for a report's.
const PURPOSE: &str = "terminus:quota-report:v1:";
/// Bytes of a tag (HMAC-SHA256).
const TAG_LEN: usize = 32;
/// The longest rate written: `f64::MAX` with three decimals (309 digits, a point, three).
const MAX_RATE_LEN: usize = 309 + 1 + 3;
/// The longest value a real report has: the version, the two longest rates, the longest
/// sequence number and time (20 digits each), three spaces, a colon and the tag in hex.
pub const MAX_VALUE: usize = AUTHENTICATED.len() + 2 * MAX_RATE_LEN + 2 * 20 + 3 + 1 + 2 * TAG_LEN;
/// The longest field (instance id) read: an id is a host name (64 bytes at most), a PID and
/// six hex digits.
pub const MAX_FIELD: usize = 256;
/// The part of a quota split evenly, whatever the demand.
const FLOOR: f64 = 0.1;
/// Weight of the newest tick in the demand average (about 0.3 s of memory).
const SMOOTHING: f64 = 0.35;
/// What an authenticated report's value begins with: the format's version, and what tells
/// it from an older instance's report (unsealed, beginning with a digit, or "s1:" sealed).
const AUTHENTICATED: &str = "m1:";
/// Why reports are ignored, for the metrics.
const IGNORED: [&str; 2] = ["unopened", "stale"];

/// The tenants a fleet shares quotas of, as the server keeps them.
pub trait Quotas: Send + Sync {
    /// Every tenant with a quota: its name, and the ACU its clients asked for and used
    /// here so far.
    fn tenants(&self) -> Vec<TenantLoad>;
    /// Sets this instance's share of `tenant`'s quota.
    fn set_share(&self, tenant: &str, share: f64);
}

/// One tenant's counters on this instance.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantLoad {
    /// The tenant's name.
    pub name: String,
    /// ACU asked for since start (admitted or refused).
    pub offered: f64,
    /// ACU used since start.
    pub used: f64,
    /// The fleet's committed ACU per second for it.
    pub quota: f64,
}

/// One instance's last report for a tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// ACU per second asked for.
    pub demand: f64,
    /// ACU per second used.
    pub used: f64,
    /// A sequence number: a report that stops changing is an instance gone.
    pub seq: u64,
}

impl Report {
    /// What is authenticated: the rates, the sequence number, and the writer's Unix time in
    /// milliseconds.
    fn encode(&self, unix_ms: u64) -> String {
        format!("{:.3} {:.3} {} {unix_ms}", self.demand, self.used, self.seq)
    }

    /// The report and its writer's time in `text`, if it is one.
    fn decode(text: &str) -> Option<(Report, u64)> {
        let mut parts = text.split(' ');
        let demand = parts.next()?.parse::<f64>().ok()?;
        let used = parts.next()?.parse::<f64>().ok()?;
        let seq = parts.next()?.parse().ok()?;
        let at = parts.next()?.parse().ok()?;
        let valid = parts.next().is_none()
            && demand.is_finite()
            && used.is_finite()
            && demand >= 0.0
            && used >= 0.0;
        valid.then_some((Report { demand, used, seq }, at))
    }

    /// The value of `id`'s field in `entry`: this report made at `unix_ms`, authenticated
    /// under `key` (the key file's [`SUBKEY_INFO`] subkey).
    fn seal(&self, key: &hmac::Key, entry: &str, id: &str, unix_ms: u64) -> String {
        let text = self.encode(unix_ms);
        let tag = tag(key, entry, id.as_bytes(), text.as_bytes());
        format!("{AUTHENTICATED}{text}:{}", hex(tag.as_ref()))
    }

    /// The report in `value`, `field`'s in `entry`, and its writer's time; `None` unless
    /// it was authenticated under `key` for this very field of this very entry. A value
    /// longer than any report is not looked into.
    fn open(key: &hmac::Key, entry: &str, field: &[u8], value: &[u8]) -> Option<(Report, u64)> {
        if value.len() > MAX_VALUE {
            return None;
        }
        let rest = value.strip_prefix(AUTHENTICATED.as_bytes())?;
        let colon = rest.iter().rposition(|&b| b == b':')?;
        let (text, tag) = (&rest[..colon], unhex(&rest[colon + 1..])?);
        hmac::verify(key, &message(entry, field, text), &tag).ok()?;
        Report::decode(std::str::from_utf8(text).ok()?)
    }
}

/// The tag of a report's `text` in `field` of `entry`.
fn tag(key: &hmac::Key, entry: &str, field: &[u8], text: &[u8]) -> hmac::Tag {
    hmac::sign(key, &message(entry, field, text))
}

/// What a report's tag is over: [`PURPOSE`], the binding to its entry and field ([`label`],
/// its length first, so that where the field ends and the text begins is fixed), the text.
fn message(entry: &str, field: &[u8], text: &[u8]) -> Vec<u8> {
    let binding = label(entry, field);
    let mut message = format!("{PURPOSE}{}:", binding.len()).into_bytes();
    message.extend_from_slice(&binding);
    message.extend_from_slice(text);
    message
}

/// A report's binding: what it is and the entry and field it was written to, the entry's
/// length first so that no two pairs give the same bytes (a tenant's name may hold a
/// colon).
fn label(entry: &str, field: &[u8]) -> Vec<u8> {
    let mut label = format!("quota-share:{}:{entry}:", entry.len()).into_bytes();
    label.extend_from_slice(field);
    label
}

/// The bytes written in hexadecimal in `text`, if that is what it holds.
fn unhex(text: &[u8]) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 || !text.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let digit = |d: u8| (d as char).to_digit(16).expect("a hex digit") as u8;
    Some(
        text.chunks_exact(2)
            .map(|p| digit(p[0]) << 4 | digit(p[1]))
            .collect(),
    )
}

/// Unix time in milliseconds, by this instance's clock.
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `me`'s share of a `quota` (ACU per second) among the `alive` reports (its own among
/// them). While the fleet asks for less than the quota, each instance gets what it asks
/// for and an even part of the rest: nobody under the quota is refused. Beyond it, a
/// floor ([`FLOOR`] split evenly) and the rest in proportion to demand.
pub fn share_of(me: &str, alive: &[(String, Report)], quota: f64) -> f64 {
    let n = alive.len().max(1) as f64;
    let total: f64 = alive.iter().map(|(_, r)| r.demand).sum();
    let mine = alive
        .iter()
        .find(|(id, _)| id == me)
        .map_or(0.0, |(_, r)| r.demand);
    if total <= 0.0 {
        return 1.0 / n;
    }
    if total < quota {
        return (mine + (quota - total) / n) / quota;
    }
    FLOOR / n + (1.0 - FLOOR) * mine / total
}

/// What an instance knows of one tenant across the fleet.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantView {
    /// Each live instance: its id, its share and its report.
    pub instances: Vec<(String, f64, Report)>,
    /// This instance's share.
    pub share: f64,
}

/// What an instance knows of every tenant's split, shared with `/capacity` and the
/// metrics.
pub type SharesView = Arc<Mutex<BTreeMap<String, TenantView>>>;

/// What this instance knows of another's reports for one tenant.
#[derive(Debug, Clone)]
struct Seen {
    /// Its newest report authenticated (the highest sequence number).
    report: Report,
    /// When its sequence number last rose, on this instance's clock.
    changed: Instant,
}

/// The instances one tenant's reports came from: at most [`MAX_INSTANCES`].
#[derive(Debug, Default)]
struct Members(HashMap<String, Seen>);

impl Members {
    /// Takes `id`'s authenticated `report`, read at `now` (this instance is `me`). Returns
    /// whether its field holds a gone instance's report, not advanced for `gone`: to delete.
    fn note(&mut self, me: &str, id: &str, report: Report, now: Instant, gone: Duration) -> bool {
        if let Some(seen) = self.0.get_mut(id) {
            if report.seq > seen.report.seq {
                *seen = Seen {
                    report,
                    changed: now,
                };
                return false;
            }
            // The same report, or an older one put back (a replay): neither is news, so
            // neither keeps an instance alive.
            return id != me && now.duration_since(seen.changed) > gone;
        }
        if self.0.len() >= MAX_INSTANCES {
            let oldest = self
                .0
                .iter()
                .filter(|(i, _)| *i != me)
                .min_by_key(|(_, s)| s.changed)
                .map(|(i, _)| i.clone());
            if let Some(oldest) = oldest {
                self.0.remove(&oldest);
            }
        }
        self.0.insert(
            id.to_owned(),
            Seen {
                report,
                changed: now,
            },
        );
        false
    }

    /// Forgets instances whose reports stopped advancing long enough ago that a replay
    /// of them is refused by its age anyway.
    fn prune(&mut self, me: &str, now: Instant) {
        self.0
            .retain(|id, s| id == me || now.duration_since(s.changed) < 2 * MAX_AGE);
    }

    /// The instances alive at `now` (`me` always), by id, with their last reports.
    fn alive(&self, me: &str, now: Instant, alive: Duration) -> Vec<(String, Report)> {
        let mut live: Vec<(String, Report)> = self
            .0
            .iter()
            .filter(|(id, s)| *id == me || now.duration_since(s.changed) < alive)
            .map(|(id, s)| (id.clone(), s.report.clone()))
            .collect();
        live.sort_by(|a, b| a.0.cmp(&b.0));
        live
    }
}

/// This instance's side of the fleet's quotas.
pub struct ShareSync {
    id: String,
    prefix: String,
    quotas: Arc<dyn Quotas>,
    /// The key file's subkey for quota reports ([`SUBKEY_INFO`]).
    key: hmac::Key,
    /// Per tenant (by name) whose hash holds more than [`MAX_FIELDS`] fields, where the
    /// next round's `HSCAN` goes on from.
    cursors: HashMap<String, u64>,
    /// Per tenant: the counters last read, when, and the smoothed rates.
    last: HashMap<String, (TenantLoad, Instant, f64, f64)>,
    /// Per tenant, the instances reporting.
    seen: HashMap<String, Members>,
    seq: u64,
    last_ok: Option<Instant>,
    /// Instances alive at the last round (the fallback's divisor).
    last_alive: usize,
    /// A report not advanced this long is an instance gone: [`ALIVE`] (tests shorten it).
    alive: Duration,
    /// Rounds have failed since the last that did not (said once).
    failing: bool,
    metrics: ShareMetrics,
}

impl ShareSync {
    /// Shares `quotas` under `prefix` as instance `id`, its reports authenticated under
    /// `kek`'s subkey for them.
    pub fn new(id: String, prefix: &str, quotas: Arc<dyn Quotas>, kek: Arc<Kek>) -> Self {
        Self {
            id,
            prefix: prefix.to_owned(),
            quotas,
            key: kek.subkey(SUBKEY_INFO),
            cursors: HashMap::new(),
            last: HashMap::new(),
            seen: HashMap::new(),
            seq: 0,
            last_ok: None,
            last_alive: 1,
            alive: ALIVE,
            failing: false,
            metrics: ShareMetrics::new(),
        }
    }

    /// What it knows of every tenant, for `/capacity` and the metrics.
    pub fn view(&self) -> SharesView {
        self.metrics.view.clone()
    }

    /// Its metrics: the shares, reports ignored, rounds failed.
    pub fn metrics(&self) -> ShareMetrics {
        self.metrics.clone()
    }

    fn entry(&self, tenant: &str) -> String {
        format!("{}quota:{tenant}", self.prefix)
    }

    /// One tick: report, read back, re-split, and delete what is gone or does not open.
    pub async fn round(&mut self, conn: &mut MultiplexedConnection) -> RedisResult<()> {
        let now = Instant::now();
        let unix_ms = unix_ms();
        let gone = 10 * self.alive;
        let loads = self.quotas.tenants();
        // A tenant gone from the configuration (a reload) takes what was known of it along.
        self.last.retain(|t, _| loads.iter().any(|l| l.name == *t));
        self.seen.retain(|t, _| loads.iter().any(|l| l.name == *t));
        self.cursors
            .retain(|t, _| loads.iter().any(|l| l.name == *t));
        if loads.is_empty() {
            self.succeeded(now);
            return Ok(());
        }
        self.seq += 1;
        let mut pipe = redis::pipe();
        for load in &loads {
            let (demand, used) = self.rates(load, now);
            let report = Report {
                demand,
                used,
                seq: self.seq,
            };
            let entry = self.entry(&load.name);
            pipe.hset(
                &entry,
                &self.id,
                report.seal(&self.key, &entry, &self.id, unix_ms),
            )
            .ignore()
            .pexpire(&entry, 10_000)
            .ignore()
            .hlen(&entry);
            // Its own report counts whatever the store gives back: someone may delete it.
            self.seen
                .entry(load.name.clone())
                .or_default()
                .note(&self.id, &self.id, report, now, gone);
        }
        let lens: Vec<usize> = pipe.query_async(conn).await?;
        let all = self.read(conn, &loads, &lens).await?;
        let oldest = unix_ms.saturating_sub(MAX_AGE.as_millis() as u64);
        let newest = unix_ms.saturating_add(AHEAD.as_millis() as u64);
        let mut doomed: Vec<(String, Vec<Vec<u8>>)> = Vec::new();
        let mut room = MAX_DELETES;
        let mut view = BTreeMap::new();
        for (load, fields) in loads.iter().zip(all) {
            let entry = self.entry(&load.name);
            let members = self.seen.entry(load.name.clone()).or_default();
            members.prune(&self.id, now);
            let (mut delete, mut unopened, mut stale) = (Vec::new(), 0, 0);
            for (field, value) in fields {
                if field.len() > MAX_FIELD {
                    unopened += 1;
                    delete.push(field);
                    continue;
                }
                let opened = Report::open(&self.key, &entry, &field, &value)
                    .and_then(|(r, at)| Some((String::from_utf8(field.clone()).ok()?, r, at)));
                match opened {
                    None => {
                        unopened += 1;
                        delete.push(field);
                    }
                    Some((_, _, at)) if at < oldest || at > newest => {
                        stale += 1;
                        delete.push(field);
                    }
                    Some((id, report, _)) => {
                        if members.note(&self.id, &id, report, now, gone) {
                            delete.push(field);
                        }
                    }
                }
            }
            if unopened + stale > 0 {
                self.metrics.ignored.add(0, unopened);
                self.metrics.ignored.add(1, stale);
                tracing::debug!(
                    "fleet: tenant {}: {unopened} quota report(s) that do not verify under the key file (an older version's, another key file's, longer than any report, or written by someone without it) and {stale} older than {MAX_AGE:?} or stamped over {AHEAD:?} ahead, ignored",
                    load.name
                );
            }
            let alive = members.alive(&self.id, now, self.alive);
            let share = share_of(&self.id, &alive, load.quota);
            self.quotas.set_share(&load.name, share);
            let instances = alive
                .iter()
                .map(|(id, r)| (id.clone(), share_of(id, &alive, load.quota), r.clone()))
                .collect();
            view.insert(load.name.clone(), TenantView { instances, share });
            delete.truncate(room);
            room -= delete.len();
            if !delete.is_empty() {
                doomed.push((entry, delete));
            }
        }
        self.last_alive = view.values().map(|v| v.instances.len()).max().unwrap_or(1);
        *self.metrics.view.lock().expect("fleet view lock") = view;
        self.succeeded(now);
        if !doomed.is_empty() {
            let mut pipe = redis::pipe();
            for (entry, fields) in &doomed {
                let hdel = pipe.cmd("HDEL").arg(entry);
                for field in fields {
                    hdel.arg(field.as_slice());
                }
                hdel.ignore();
            }
            pipe.query_async::<()>(conn).await?;
        }
        Ok(())
    }

    /// Every field of each tenant's hash (`lens` fields long), or, for one of more than
    /// [`MAX_FIELDS`], at most about that many a round, read with `HSCAN` on from where the
    /// last round stopped.
    async fn read(
        &mut self,
        conn: &mut MultiplexedConnection,
        loads: &[TenantLoad],
        lens: &[usize],
    ) -> RedisResult<Vec<Vec<(Vec<u8>, Vec<u8>)>>> {
        let mut pipe = redis::pipe();
        let mut whole = 0;
        for (load, len) in loads.iter().zip(lens) {
            if *len <= MAX_FIELDS {
                pipe.hgetall(self.entry(&load.name));
                whole += 1;
            }
        }
        let mut small: std::vec::IntoIter<Vec<(Vec<u8>, Vec<u8>)>> = if whole > 0 {
            pipe.query_async(conn).await?
        } else {
            Vec::new()
        }
        .into_iter();
        let mut all = Vec::with_capacity(loads.len());
        for (load, len) in loads.iter().zip(lens) {
            let entry = self.entry(&load.name);
            if *len <= MAX_FIELDS {
                self.cursors.remove(&load.name);
                all.push(small.next().unwrap_or_default());
                continue;
            }
            if !self.cursors.contains_key(&load.name) {
                tracing::warn!(
                    "fleet: tenant {}: its quota reports' hash holds {len} fields, more than {MAX_FIELDS} (junk written to the store?): read {MAX_FIELDS} a round, what does not verify deleted",
                    load.name
                );
            }
            let mut cursor = self.cursors.get(&load.name).copied().unwrap_or(0);
            let mut fields = Vec::new();
            loop {
                let (next, page): (u64, Vec<Vec<u8>>) = redis::cmd("HSCAN")
                    .arg(&entry)
                    .arg(cursor)
                    .arg("COUNT")
                    .arg(SCAN_PAGE)
                    .query_async(conn)
                    .await?;
                let mut page = page.into_iter();
                while let (Some(field), Some(value)) = (page.next(), page.next()) {
                    fields.push((field, value));
                }
                cursor = next;
                if cursor == 0 || fields.len() >= MAX_FIELDS {
                    break;
                }
            }
            fields.truncate(MAX_FIELDS);
            self.cursors.insert(load.name.clone(), cursor);
            all.push(fields);
        }
        Ok(all)
    }

    /// A round went through.
    fn succeeded(&mut self, now: Instant) {
        self.last_ok = Some(now);
        if self.failing {
            tracing::info!("fleet: quota share rounds go through again");
            self.failing = false;
        }
    }

    /// A round failed (or ran past [`ROUND_BUDGET`]) for `why`, the store still
    /// answering the ticket keys: the shares hold, then split evenly, as in an outage.
    pub fn failed(&mut self, why: &str) {
        self.metrics.failed.inc();
        if !self.failing {
            tracing::warn!("fleet: a quota share round failed ({why}); the shares hold, then split evenly, until one goes through (ticket keys are kept in step apart)");
            self.failing = true;
        }
        self.outage();
    }

    /// The store cannot be reached: past [`HOLD`] since the last round, an even split
    /// among the instances last seen.
    pub fn outage(&mut self) {
        if self.last_ok.is_some_and(|t| t.elapsed() < HOLD) {
            return;
        }
        let share = 1.0 / self.last_alive.max(1) as f64;
        for load in self.quotas.tenants() {
            self.quotas.set_share(&load.name, share);
        }
        for view in self
            .metrics
            .view
            .lock()
            .expect("fleet view lock")
            .values_mut()
        {
            view.share = share;
            view.instances.clear();
        }
    }

    /// The tenant's demand and use, ACU per second, smoothed over a few ticks.
    fn rates(&mut self, load: &TenantLoad, now: Instant) -> (f64, f64) {
        let entry = self
            .last
            .entry(load.name.clone())
            .or_insert((load.clone(), now, 0.0, 0.0));
        let dt = now.duration_since(entry.1).as_secs_f64();
        if dt > 0.0 {
            let demand = (load.offered - entry.0.offered).max(0.0) / dt;
            let used = (load.used - entry.0.used).max(0.0) / dt;
            entry.2 = SMOOTHING * demand + (1.0 - SMOOTHING) * entry.2;
            entry.3 = SMOOTHING * used + (1.0 - SMOOTHING) * entry.3;
            entry.0 = load.clone();
            entry.1 = now;
        }
        (entry.2, entry.3)
    }
}

/// The shares, the reports ignored and the rounds failed, as metrics.
#[derive(Debug, Clone)]
pub struct ShareMetrics {
    view: SharesView,
    ignored: Arc<Labelled<2>>,
    failed: Arc<Counter>,
}

impl ShareMetrics {
    fn new() -> Self {
        Self {
            view: Arc::default(),
            ignored: Arc::new(Labelled::counter(
                "terminus_fleet_share_reports_ignored_total",
                "Quota share reports in the fleet's store ignored and deleted: unopened (not authenticated under this key file for their field: an older version's, another key file's, longer than any report, or forged) or stale (written more than a minute ago or stamped over 5 s ahead: a replay).",
                label_values("reason", IGNORED, &Labels::NONE),
            )),
            failed: Arc::new(Counter::new(
                "terminus_fleet_share_rounds_failed_total",
                "Quota share rounds that failed or ran past their time while the store kept the ticket keys.",
            )),
        }
    }

    /// What this instance knows of every tenant's split.
    pub fn view(&self) -> &SharesView {
        &self.view
    }

    /// Reports ignored for `reason`: `"unopened"` or `"stale"`.
    pub fn ignored(&self, reason: &str) -> i64 {
        IGNORED
            .iter()
            .position(|r| *r == reason)
            .map_or(0, |i| self.ignored.get(i))
    }

    /// Share rounds that failed or ran past [`ROUND_BUDGET`].
    pub fn failed(&self) -> u64 {
        self.failed.get()
    }
}

impl Render for ShareMetrics {
    fn render(&self, out: &mut Exposition) {
        let view = self.view.lock().expect("fleet view lock");
        out.header(
            "terminus_tenant_fleet_share",
            Kind::Gauge,
            "This instance's share of each tenant's fleet-wide quota.",
        );
        for (tenant, v) in view.iter() {
            out.sample(
                "terminus_tenant_fleet_share",
                &Labels::of([("tenant", tenant)]),
                v.share,
            );
        }
        out.header(
            "terminus_fleet_instances",
            Kind::Gauge,
            "Instances sharing the tenants' quotas, as this one last saw them.",
        );
        let n = view.values().map(|v| v.instances.len()).max().unwrap_or(0);
        out.sample("terminus_fleet_instances", &Labels::NONE, n);
        drop(view);
        self.ignored.render(out);
        self.failed.render(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{kek, Redis, Steady, Store};

    fn report(demand: f64) -> Report {
        Report {
            demand,
            used: 0.0,
            seq: 1,
        }
    }

    #[test]
    fn shares_follow_demand_above_a_floor_and_sum_to_one() {
        let ids = ["a", "b", "c"];
        let split = |demands: [f64; 3], quota: f64| -> Vec<f64> {
            let alive: Vec<(String, Report)> = ids
                .iter()
                .zip(demands)
                .map(|(id, d)| (id.to_string(), report(d)))
                .collect();
            ids.iter().map(|id| share_of(id, &alive, quota)).collect()
        };
        // Twice the quota asked for, 60/30/10: the floor and the rest by demand.
        let shares = split([120.0, 60.0, 20.0], 100.0);
        assert!(
            (shares.iter().sum::<f64>() - 1.0).abs() < 1e-9,
            "{shares:?}"
        );
        assert!(
            (shares[0] - (0.1 / 3.0 + 0.9 * 0.6)).abs() < 1e-9,
            "{shares:?}"
        );
        // Under the quota: each gets its demand and a third of what is left.
        let shares = split([30.0, 10.0, 0.0], 100.0);
        assert!(
            (shares.iter().sum::<f64>() - 1.0).abs() < 1e-9,
            "{shares:?}"
        );
        assert!((shares[0] * 100.0 - 50.0).abs() < 1e-9, "{shares:?}");
        assert!((shares[2] * 100.0 - 20.0).abs() < 1e-9, "{shares:?}");
        // No demand anywhere: even.
        assert_eq!(split([0.0; 3], 100.0), vec![1.0 / 3.0; 3]);
        // Alone: everything.
        assert_eq!(
            share_of("a", &[("a".to_owned(), report(300.0))], 100.0),
            1.0
        );
    }

    #[test]
    fn reports_round_trip_and_garbage_is_dropped() {
        let r = Report {
            demand: 12.5,
            used: 3.25,
            seq: 9,
        };
        assert_eq!(Report::decode(&r.encode(1234)), Some((r, 1234)));
        for bad in [
            "",
            "1 2 3",
            "1 2 3 4 5",
            "x 1 2 3",
            "-1 0 1 3",
            "NaN 0 1 3",
            "1 inf 1 3",
        ] {
            assert_eq!(Report::decode(bad), None, "{bad:?}");
        }
    }

    /// The tests' key file's subkey for reports.
    fn key() -> hmac::Key {
        kek().subkey(SUBKEY_INFO)
    }

    #[test]
    fn a_sealed_report_opens_only_under_its_key_file_entry_and_field() {
        let (kek, other) = (key(), Kek::from_hex(&"1e".repeat(32)).unwrap());
        let other = other.subkey(SUBKEY_INFO);
        let r = Report {
            demand: 12.5,
            used: 3.25,
            seq: 9,
        };
        let entry = "terminus:quota:t";
        let sealed = r.seal(&kek, entry, "a", 1234);
        assert!(sealed.starts_with(AUTHENTICATED), "{sealed}");
        let open = |kek: &hmac::Key, entry: &str, field: &str, value: &str| {
            Report::open(kek, entry, field.as_bytes(), value.as_bytes())
        };
        assert_eq!(open(&kek, entry, "a", &sealed), Some((r.clone(), 1234)));
        assert_eq!(open(&other, entry, "a", &sealed), None, "another key file");
        assert_eq!(open(&kek, entry, "b", &sealed), None, "another field");
        assert_eq!(
            open(&kek, "terminus:quota:u", "a", &sealed),
            None,
            "another tenant"
        );
        assert_eq!(
            open(&kek, entry, "a", &r.encode(1234)),
            None,
            "unsealed, as an older version writes them"
        );
        let mut flipped = sealed.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
        assert_eq!(
            open(&kek, entry, "a", std::str::from_utf8(&flipped).unwrap()),
            None,
            "altered"
        );
        // A colon in a tenant's name moves no report between entry and field.
        let colon = r.seal(&kek, "p:quota:a:b", "c", 1);
        assert_eq!(open(&kek, "p:quota:a", "b:c", &colon), None);
    }

    /// The wire format, computed apart: HMAC-SHA256 under HKDF-SHA256 of the key file (not
    /// the key file's AES-GCM key), over the purpose, the binding and the text in the clear.
    #[test]
    fn a_report_is_its_text_in_the_clear_and_an_hmac_under_the_key_files_report_subkey() {
        use aws_lc_rs::hkdf;
        let r = Report {
            demand: 12.5,
            used: 3.25,
            seq: 9,
        };
        let entry = "terminus:quota:t";
        let value = r.seal(&key(), entry, "a", 1234);
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"terminus fleet key file subkeys")
            .extract(&[0x0f; 32]);
        let subkey: hmac::Key = prk
            .expand(&[b"terminus fleet quota-report v1"], hmac::HMAC_SHA256)
            .unwrap()
            .into();
        let binding = "quota-share:16:terminus:quota:t:a";
        let message = format!(
            "terminus:quota-report:v1:{}:{binding}12.500 3.250 9 1234",
            binding.len()
        );
        let tag = hmac::sign(&subkey, message.as_bytes());
        assert_eq!(
            value,
            format!("m1:12.500 3.250 9 1234:{}", hex(tag.as_ref()))
        );
        // The same made with the key file itself (no subkey) does not verify.
        let raw = hmac::Key::new(hmac::HMAC_SHA256, &[0x0f; 32]);
        let forged = format!(
            "m1:12.500 3.250 9 1234:{}",
            hex(hmac::sign(&raw, message.as_bytes()).as_ref())
        );
        assert_eq!(Report::open(&key(), entry, b"a", forged.as_bytes()), None);
        // Nor does a report sealed under the key file's wrapping key, as the last version
        // wrote them.
        let sealed = kek().seal(binding.as_bytes(), b"12.500 3.250 9 1234");
        let old = format!("s1:{}", hex(&sealed));
        assert_eq!(Report::open(&key(), entry, b"a", old.as_bytes()), None);
    }

    #[test]
    fn no_real_report_is_longer_than_max_value_and_a_longer_one_is_not_opened() {
        let longest = Report {
            demand: f64::MAX,
            used: f64::MAX,
            seq: u64::MAX,
        };
        let value = longest.seal(&key(), "e", "a", u64::MAX);
        assert_eq!(value.len(), MAX_VALUE);
        assert_eq!(
            Report::open(&key(), "e", b"a", value.as_bytes()),
            Some((longest, u64::MAX))
        );
        // A value authenticated but longer than that (zeros before a rate) is not opened.
        let text = format!("{}1.000 0.000 1 1", "0".repeat(MAX_VALUE));
        let tag = tag(&key(), "e", b"a", text.as_bytes());
        let long = format!("m1:{text}:{}", hex(tag.as_ref()));
        assert_eq!(Report::open(&key(), "e", b"a", long.as_bytes()), None);
    }

    #[test]
    fn an_instance_set_holds_max_instances_dropping_the_oldest_never_this_one() {
        let start = Instant::now();
        let mut members = Members::default();
        let gone = Duration::from_secs(10);
        members.note("me", "me", report(1.0), start, gone);
        for i in 0..MAX_INSTANCES + 6 {
            let at = start + Duration::from_millis(1 + i as u64);
            members.note("me", &format!("i{i:04}"), report(1.0), at, gone);
        }
        assert_eq!(members.0.len(), MAX_INSTANCES);
        assert!(
            members.0.contains_key("me"),
            "this instance, the oldest, kept"
        );
        for i in 0..7 {
            assert!(!members.0.contains_key(&format!("i{i:04}")), "i{i} dropped");
        }
        assert!(members.0.contains_key("i0007"));
    }

    /// Instance `id` sharing `quotas` under "terminus:" with the tests' key file.
    fn sync(id: &str, quotas: Arc<Steady>) -> ShareSync {
        ShareSync::new(id.into(), "terminus:", quotas, Arc::new(kek()))
    }

    /// The instances `sync` counts for `tenant`, by id.
    fn counted(sync: &ShareSync, tenant: &str) -> Vec<String> {
        let view = sync.view();
        let view = view.lock().unwrap();
        view[tenant]
            .instances
            .iter()
            .map(|(id, _, _)| id.clone())
            .collect()
    }

    async fn hset(conn: &mut MultiplexedConnection, entry: &str, field: &str, value: &str) {
        let _: i64 = redis::cmd("HSET")
            .arg(entry)
            .arg(field)
            .arg(value)
            .query_async(conn)
            .await
            .unwrap();
    }

    async fn hget(conn: &mut MultiplexedConnection, entry: &str, field: &str) -> String {
        redis::cmd("HGET")
            .arg(entry)
            .arg(field)
            .query_async(conn)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn forged_reports_neither_count_as_instances_nor_move_the_real_shares() {
        let Some(redis) = Redis::start() else { return };
        let mut conn = redis.connect().await;
        let entry = "terminus:quota:t";
        let (qa, qb) = (
            Steady::new(&[("t", 60.0)], 100.0),
            Steady::new(&[("t", 60.0)], 100.0),
        );
        let (mut a, mut b) = (sync("a", qa.clone()), sync("b", qb.clone()));
        let other = Kek::from_hex(&"1e".repeat(32)).unwrap().subkey(SUBKEY_INFO);
        let huge = Report {
            demand: 1e6,
            used: 0.0,
            seq: 1,
        };
        for round in 0..10 {
            // Written again every round, as deleted: unsealed (as an older version writes
            // them, in the old format and the new one) and sealed under another key file.
            let now = unix_ms();
            hset(&mut conn, entry, "evil", &huge.encode(now)).await;
            hset(&mut conn, entry, "evil-old", "1000000.000 0.000 1").await;
            let sealed = huge.seal(&other, entry, "evil-other", now);
            hset(&mut conn, entry, "evil-other", &sealed).await;
            a.round(&mut conn).await.unwrap();
            b.round(&mut conn).await.unwrap();
            // Whichever reads them first deletes them.
            let ignored = a.metrics().ignored("unopened") + b.metrics().ignored("unopened");
            assert_eq!(ignored, 3 * (round + 1));
            tokio::time::sleep(TICK).await;
        }
        assert_eq!(counted(&b, "t"), ["a", "b"]);
        for q in [&qa, &qb] {
            let share = q.share("t").unwrap();
            assert!(
                (share - 0.5).abs() < 0.05,
                "{share}: two instances asking the same"
            );
        }
        assert_eq!(b.seen["t"].0.len(), 2, "a forged id remembered");
    }

    #[tokio::test]
    async fn a_sealed_report_copied_to_another_field_or_tenant_is_ignored() {
        let Some(redis) = Redis::start() else { return };
        let mut conn = redis.connect().await;
        let mut a = sync("a", Steady::new(&[("t", 10.0)], 100.0));
        let mut b = sync("b", Steady::new(&[("t", 10.0), ("u", 10.0)], 100.0));
        for _ in 0..5 {
            a.round(&mut conn).await.unwrap();
            let genuine = hget(&mut conn, "terminus:quota:t", "a").await;
            hset(&mut conn, "terminus:quota:t", "a-copy", &genuine).await;
            hset(&mut conn, "terminus:quota:u", "a", &genuine).await;
            b.round(&mut conn).await.unwrap();
            tokio::time::sleep(TICK).await;
        }
        assert_eq!(counted(&b, "t"), ["a", "b"]);
        assert_eq!(counted(&b, "u"), ["b"]);
        assert_eq!(b.metrics().ignored("unopened"), 2 * 5);
    }

    #[tokio::test]
    async fn a_replayed_report_keeps_no_gone_instance_alive() {
        let Some(redis) = Redis::start() else { return };
        let mut conn = redis.connect().await;
        let entry = "terminus:quota:t";
        let mut a = sync("a", Steady::new(&[("t", 10.0)], 100.0));
        let mut b = sync("b", Steady::new(&[("t", 10.0)], 100.0));
        b.alive = Duration::from_millis(300);
        let mut recorded = Vec::new();
        for _ in 0..3 {
            a.round(&mut conn).await.unwrap();
            b.round(&mut conn).await.unwrap();
            recorded.push(hget(&mut conn, entry, "a").await);
            tokio::time::sleep(TICK).await;
        }
        assert_eq!(counted(&b, "t"), ["a", "b"]);
        // a is gone; its reports are put back, older ones turn by turn; and an instance
        // b never heard of comes back from a record of reports made a while ago.
        let kek = key();
        let long_ago = unix_ms() - MAX_AGE.as_millis() as u64 - 1000;
        for i in 0..12 {
            hset(&mut conn, entry, "a", &recorded[i % 2]).await;
            let ghost = Report {
                demand: 50.0,
                used: 0.0,
                seq: 1000 + i as u64,
            };
            let ghost = ghost.seal(&kek, entry, "ghost", long_ago + 100 * i as u64);
            hset(&mut conn, entry, "ghost", &ghost).await;
            b.round(&mut conn).await.unwrap();
            tokio::time::sleep(TICK).await;
        }
        assert_eq!(counted(&b, "t"), ["b"]);
        assert_eq!(b.metrics().ignored("stale"), 12);
    }

    #[tokio::test]
    async fn gone_and_unopened_reports_go_in_one_hdel_a_round_at_most_max_deletes() {
        let Some(redis) = Redis::start() else { return };
        let mut conn = redis.connect().await;
        let entry = "terminus:quota:t";
        let mut b = sync("b", Steady::new(&[("t", 10.0)], 100.0));
        b.alive = Duration::from_millis(20);
        // 200 instances report once and go; then 200 fields of junk come.
        let kek = key();
        let now = unix_ms();
        let mut hset = redis::cmd("HSET");
        hset.arg(entry);
        for i in 0..200 {
            let id = format!("g{i}");
            let report = Report {
                demand: 1.0,
                used: 0.0,
                seq: 1,
            };
            hset.arg(&id).arg(report.seal(&kek, entry, &id, now));
        }
        let _: i64 = hset.query_async(&mut conn).await.unwrap();
        b.round(&mut conn).await.unwrap();
        assert_eq!(counted(&b, "t").len(), 201);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut hset = redis::cmd("HSET");
        hset.arg(entry);
        for i in 0..200 {
            hset.arg(format!("junk{i}")).arg("junk");
        }
        let _: i64 = hset.query_async(&mut conn).await.unwrap();
        let fields = || redis.cli(&["HLEN", entry]).trim().parse::<usize>().unwrap();
        redis.cli(&["CONFIG", "RESETSTAT"]);
        b.round(&mut conn).await.unwrap();
        assert_eq!(redis.calls("hdel"), 1);
        assert_eq!(fields(), 1 + 400 - MAX_DELETES);
        b.round(&mut conn).await.unwrap();
        assert_eq!(redis.calls("hdel"), 2);
        assert_eq!(fields(), 1, "this instance's report alone");
        assert_eq!(counted(&b, "t"), ["b"]);
    }

    #[tokio::test]
    async fn a_report_stamped_in_the_future_is_stale_and_counts_for_nothing() {
        let Some(redis) = Redis::start() else { return };
        let mut conn = redis.connect().await;
        let entry = "terminus:quota:t";
        let mut b = sync("b", Steady::new(&[("t", 10.0)], 100.0));
        let key = key();
        // Recorded from an instance whose clock ran ahead (or made up by one that had the
        // key), to be put back later: a minute ahead is refused, a second ahead is not.
        for i in 0..5u64 {
            let now = unix_ms();
            let ahead = Report {
                demand: 50.0,
                used: 0.0,
                seq: 1 + i,
            };
            let future = ahead.seal(&key, entry, "future", now + 60_000);
            hset(&mut conn, entry, "future", &future).await;
            let skewed = ahead.seal(&key, entry, "skewed", now + 1_000);
            hset(&mut conn, entry, "skewed", &skewed).await;
            b.round(&mut conn).await.unwrap();
            tokio::time::sleep(TICK).await;
        }
        assert_eq!(counted(&b, "t"), ["b", "skewed"]);
        assert_eq!(b.metrics().ignored("stale"), 5);
    }

    #[tokio::test]
    async fn a_hash_of_junk_is_read_a_bounded_part_a_round_and_long_values_unread() {
        let Some(redis) = Redis::start() else { return };
        let mut conn = redis.connect().await;
        let entry = "terminus:quota:t";
        let mut b = sync("b", Steady::new(&[("t", 10.0)], 100.0));
        // Five times the bound in junk.
        let junk = 5 * MAX_FIELDS;
        let mut hset_all = redis::cmd("HSET");
        hset_all.arg(entry);
        for i in 0..junk {
            hset_all.arg(format!("junk{i}")).arg("junk");
        }
        let _: i64 = hset_all.query_async(&mut conn).await.unwrap();
        redis.cli(&["CONFIG", "RESETSTAT"]);
        b.round(&mut conn).await.unwrap();
        assert_eq!(redis.calls("hgetall"), 0, "the whole hash read");
        assert!(redis.calls("hscan") >= 1);
        let read = b.metrics().ignored("unopened") as usize;
        assert!(
            (MAX_FIELDS / 2..=MAX_FIELDS).contains(&read),
            "{read} fields decoded in one round"
        );
        // The next round goes on from there: other fields.
        b.round(&mut conn).await.unwrap();
        let more = b.metrics().ignored("unopened") as usize - read;
        assert!((MAX_FIELDS / 2..=MAX_FIELDS).contains(&more), "{more}");
        assert_eq!(counted(&b, "t"), ["b"]);

        // Back under the bound: a value longer than any report, even one authenticated, is
        // deleted without being decoded, and so is a field longer than any id.
        let _: () = redis::cmd("DEL")
            .arg(entry)
            .query_async(&mut conn)
            .await
            .unwrap();
        let text = format!("{}50.000 0.000 1 {}", "0".repeat(100_000), unix_ms());
        let tag = tag(&key(), entry, b"long", text.as_bytes());
        hset(
            &mut conn,
            entry,
            "long",
            &format!("m1:{text}:{}", hex(tag.as_ref())),
        )
        .await;
        let id = "i".repeat(MAX_FIELD + 1);
        let report = Report {
            demand: 50.0,
            used: 0.0,
            seq: 1,
        };
        let long_id = report.seal(&key(), entry, &id, unix_ms());
        hset(&mut conn, entry, &id, &long_id).await;
        let before = b.metrics().ignored("unopened");
        b.round(&mut conn).await.unwrap();
        assert_eq!(counted(&b, "t"), ["b"]);
        assert_eq!(b.metrics().ignored("unopened") - before, 2);
        assert_eq!(
            redis.cli(&["HLEN", entry]).trim(),
            "1",
            "this instance's report alone"
        );
    }
}
