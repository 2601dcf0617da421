//! A redis-server of a test's own, for the tests of the fleet's store (the fleet crate's
//! and the end-to-end ones alike).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{eventually, free_port, runs_here, Need};

/// A redis-server on a loopback port, empty, persisting nothing; killed (by its PID) when
/// dropped.
pub struct Redis {
    child: Child,
    /// The port it listens on.
    pub port: u16,
}

impl Redis {
    /// One started on a free port; `None` (the skip reported) where redis-server is not
    /// installed.
    pub fn start() -> Option<Redis> {
        Self::start_on(0)
    }

    /// One started on `port` (0: a free one), as [`Redis::start`].
    pub fn start_on(port: u16) -> Option<Redis> {
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
        let port = if port == 0 { free_port() } else { port };
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

    /// Its URL, database 0.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// `redis-cli` against it; stdout, raw.
    pub fn cli(&self, args: &[&str]) -> String {
        String::from_utf8_lossy(&self.cli_bytes(args)).into_owned()
    }

    /// `redis-cli` against it; stdout's bytes.
    pub fn cli_bytes(&self, args: &[&str]) -> Vec<u8> {
        Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "--raw"])
            .args(args)
            .output()
            .map(|o| o.stdout)
            .unwrap_or_default()
    }

    /// How many times `command` ran since the statistics were last reset (`CONFIG
    /// RESETSTAT`).
    pub fn calls(&self, command: &str) -> u64 {
        let stats = self.cli(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().expect("a count"))
    }

    /// Kills it by its PID, as an outage would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
