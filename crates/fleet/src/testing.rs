//! A redis-server of a test's own, for the tests that need the fleet's store (as the
//! fleet's end-to-end tests in crates/terminus start one).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use terminus_testkit::{eventually, runs_here, Need};

use crate::tickets::key::Kek;

/// The key file's key the tests seal under.
pub(crate) fn kek() -> Kek {
    Kek::from_hex(&"0f".repeat(32)).expect("a key")
}

/// A redis-server on a free loopback port, empty, persisting nothing; killed (by its PID)
/// when dropped.
pub(crate) struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    /// One started; `None` (the skip reported) where redis-server is not installed.
    pub(crate) fn start() -> Option<Redis> {
        let installed = Command::new("redis-server")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !runs_here(
            Need::Redis,
            installed,
            "redis-server is not installed (apt-get install redis-server)",
        ) {
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir", "/tmp"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let redis = Redis { child, port };
        eventually(Duration::from_secs(10), "redis answering", || {
            redis.cli(&["PING"]).trim() == "PONG"
        });
        Some(redis)
    }

    /// A client of it.
    pub(crate) fn client(&self) -> redis::Client {
        redis::Client::open(format!("redis://127.0.0.1:{}/0", self.port)).expect("a URL")
    }

    /// A connection to it.
    pub(crate) async fn connect(&self) -> MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .expect("redis connects")
    }

    /// `redis-cli` against it; stdout.
    pub(crate) fn cli(&self, args: &[&str]) -> String {
        Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "--raw"])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// How many times `command` ran since the statistics were last reset (`CONFIG
    /// RESETSTAT`).
    pub(crate) fn calls(&self, command: &str) -> u64 {
        let stats = self.cli(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().expect("a count"))
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
