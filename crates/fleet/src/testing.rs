//! A redis-server of a test's own, for the tests that need the fleet's store (as the
//! fleet's end-to-end tests in crates/terminus start one).

use redis::aio::MultiplexedConnection;

use crate::tickets::key::Kek;

/// The key file's key the tests seal under.
pub(crate) fn kek() -> Kek {
    Kek::from_hex(&"0f".repeat(32)).expect("a key")
}

pub(crate) use terminus_testkit::Redis;

/// The fleet's clients of a test's redis-server.
pub(crate) trait Store {
    /// A client of it.
    fn client(&self) -> redis::Client;
    /// A connection to it.
    async fn connect(&self) -> MultiplexedConnection;
}

impl Store for Redis {
    fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("a URL")
    }

    async fn connect(&self) -> MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .expect("redis connects")
    }
}

/// Tenants asked for and using a steady rate each, every one with the same quota; the
/// shares set kept.
pub(crate) struct Steady {
    rates: Vec<(String, f64)>,
    quota: f64,
    start: std::time::Instant,
    shares: std::sync::Mutex<std::collections::HashMap<String, f64>>,
}

impl Steady {
    /// `rates`' tenants (name, ACU per second), each with a quota of `quota`.
    pub(crate) fn new(rates: &[(&str, f64)], quota: f64) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            rates: rates.iter().map(|(n, r)| (n.to_string(), *r)).collect(),
            quota,
            start: std::time::Instant::now(),
            shares: Default::default(),
        })
    }

    /// The share last set for `tenant`.
    pub(crate) fn share(&self, tenant: &str) -> Option<f64> {
        self.shares.lock().unwrap().get(tenant).copied()
    }
}

impl crate::shares::Quotas for Steady {
    fn tenants(&self) -> Vec<crate::shares::TenantLoad> {
        let t = self.start.elapsed().as_secs_f64();
        self.rates
            .iter()
            .map(|(name, rate)| crate::shares::TenantLoad {
                name: name.clone(),
                offered: rate * t,
                used: rate * t,
                quota: self.quota,
            })
            .collect()
    }

    fn set_share(&self, tenant: &str, share: f64) {
        self.shares.lock().unwrap().insert(tenant.to_owned(), share);
    }
}
