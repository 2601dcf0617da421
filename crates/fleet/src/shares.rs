//! A fleet's quotas: a `[[tenant]]`'s ACU are the fleet's, and each instance enforces its
//! share with its own meters, so that no handshake waits on the store.
//!
//! Every tick (100 ms) an instance reports, per tenant with a quota, the ACU per second
//! its clients asked for and used, and reads every instance's report back, in one
//! pipeline; all instances then compute the same shares from the same reports: a floor
//! (a tenth of the quota split evenly, so an instance that starts seeing a tenant admits
//! it at once) and the rest in proportion to demand. Shares move the meters' rates, never
//! their state (what was used ahead is still owed). An instance that stops reporting is
//! out of the split once its report has not changed for [`ALIVE`] on the reader's own
//! clock, so clocks need not agree.
//!
//! When the store is gone, an instance holds its last shares for [`HOLD`], then falls
//! back to an even split among the instances it last saw: the fleet stays at or under the
//! quota as long as no instance joins meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::RedisResult;
use terminus_metrics::{Exposition, Kind, Render};

/// How often instances report and re-split.
pub const TICK: Duration = Duration::from_millis(100);
/// A report unchanged this long is an instance gone.
pub const ALIVE: Duration = Duration::from_secs(1);
/// How long the last shares hold with the store gone.
pub const HOLD: Duration = Duration::from_secs(3);
/// The part of a quota split evenly, whatever the demand.
const FLOOR: f64 = 0.1;
/// Weight of the newest tick in the demand average (about 0.3 s of memory).
const SMOOTHING: f64 = 0.35;

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
    fn encode(&self) -> String {
        format!("{:.3} {:.3} {}", self.demand, self.used, self.seq)
    }

    fn decode(text: &str) -> Option<Report> {
        let mut parts = text.split(' ');
        let demand = parts.next()?.parse::<f64>().ok()?;
        let used = parts.next()?.parse::<f64>().ok()?;
        let seq = parts.next()?.parse().ok()?;
        (demand.is_finite() && used.is_finite() && demand >= 0.0 && used >= 0.0).then_some(Report {
            demand,
            used,
            seq,
        })
    }
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

/// This instance's side of the fleet's quotas.
pub struct ShareSync {
    id: String,
    prefix: String,
    quotas: Arc<dyn Quotas>,
    /// Per tenant: the counters last read, when, and the smoothed rates.
    last: HashMap<String, (TenantLoad, Instant, f64, f64)>,
    /// Per tenant and instance: the report's seq and when it last changed, here.
    seen: HashMap<(String, String), (u64, Instant)>,
    seq: u64,
    last_ok: Option<Instant>,
    /// Instances alive at the last round (the fallback's divisor).
    last_alive: usize,
    view: SharesView,
}

impl ShareSync {
    /// Shares `quotas` under `prefix` as instance `id`.
    pub fn new(id: String, prefix: &str, quotas: Arc<dyn Quotas>) -> Self {
        Self {
            id,
            prefix: prefix.to_owned(),
            quotas,
            last: HashMap::new(),
            seen: HashMap::new(),
            seq: 0,
            last_ok: None,
            last_alive: 1,
            view: Arc::default(),
        }
    }

    /// What it knows of every tenant, for `/capacity` and the metrics.
    pub fn view(&self) -> SharesView {
        self.view.clone()
    }

    fn entry(&self, tenant: &str) -> String {
        format!("{}quota:{tenant}", self.prefix)
    }

    /// One tick: report, read back, re-split.
    pub async fn round(&mut self, conn: &mut MultiplexedConnection) -> RedisResult<()> {
        let now = Instant::now();
        let loads = self.quotas.tenants();
        if loads.is_empty() {
            self.last_ok = Some(now);
            return Ok(());
        }
        self.seq += 1;
        let mut pipe = redis::pipe();
        let mut mine = Vec::new();
        for load in &loads {
            let (demand, used) = self.rates(load, now);
            let report = Report {
                demand,
                used,
                seq: self.seq,
            };
            let entry = self.entry(&load.name);
            pipe.hset(&entry, &self.id, report.encode())
                .ignore()
                .pexpire(&entry, 10_000)
                .ignore()
                .hgetall(&entry);
            mine.push((load.name.clone(), load.quota));
        }
        let all: Vec<HashMap<String, String>> = pipe.query_async(conn).await?;
        let mut gone = Vec::new();
        let mut view = BTreeMap::new();
        for ((tenant, quota), reports) in mine.iter().zip(all) {
            let mut alive = Vec::new();
            for (id, text) in reports {
                let Some(report) = Report::decode(&text) else {
                    continue;
                };
                let key = (tenant.clone(), id.clone());
                let (seq, changed) = self.seen.entry(key).or_insert((report.seq, now));
                if *seq != report.seq {
                    (*seq, *changed) = (report.seq, now);
                }
                if id == self.id || now.duration_since(*changed) < ALIVE {
                    alive.push((id, report));
                } else if now.duration_since(*changed) > 10 * ALIVE {
                    gone.push((self.entry(tenant), id));
                }
            }
            let share = share_of(&self.id, &alive, *quota);
            self.quotas.set_share(tenant, share);
            let instances = alive
                .iter()
                .map(|(id, r)| (id.clone(), share_of(id, &alive, *quota), r.clone()))
                .collect();
            view.insert(tenant.clone(), TenantView { instances, share });
        }
        self.last_alive = view.values().map(|v| v.instances.len()).max().unwrap_or(1);
        *self.view.lock().expect("fleet view lock") = view;
        self.last_ok = Some(now);
        for (entry, id) in gone {
            let _: i64 = redis::cmd("HDEL")
                .arg(entry)
                .arg(&id)
                .query_async(conn)
                .await?;
            self.seen.retain(|(_, i), _| i != &id);
        }
        Ok(())
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
        for view in self.view.lock().expect("fleet view lock").values_mut() {
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

/// The shares, as metrics.
pub struct ShareMetrics(pub SharesView);

impl Render for ShareMetrics {
    fn render(&self, out: &mut Exposition) {
        let view = self.0.lock().expect("fleet view lock");
        out.header(
            "terminus_tenant_fleet_share",
            Kind::Gauge,
            "This instance's share of each tenant's fleet-wide quota.",
        );
        for (tenant, v) in view.iter() {
            out.sample(
                "terminus_tenant_fleet_share",
                &format!("tenant=\"{tenant}\""),
                v.share,
            );
        }
        out.header(
            "terminus_fleet_instances",
            Kind::Gauge,
            "Instances sharing the tenants' quotas, as this one last saw them.",
        );
        let n = view.values().map(|v| v.instances.len()).max().unwrap_or(0);
        out.sample("terminus_fleet_instances", "", n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(Report::decode(&r.encode()), Some(r));
        for bad in ["", "1 2", "x 1 2", "-1 0 1", "NaN 0 1", "1 inf 1"] {
            assert_eq!(Report::decode(bad), None, "{bad:?}");
        }
    }
}
