//! A redis-server of the test's own, for the tests of a fleet's store.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use terminus_testkit::{eventually, runs_here, Need};

use super::free_port;

/// A redis-server of the test's own on a loopback port, killed (by its PID) when dropped.
pub struct Redis {
    child: Child,
    pub port: u16,
}

impl Redis {
    /// Starts one on `port` (0: a free one), empty, persisting nothing; `None` (the skip
    /// reported) where redis-server is not installed.
    pub fn start(port: u16) -> Option<Redis> {
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

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// `redis-cli` against it; stdout, raw.
    pub fn cli(&self, args: &[&str]) -> String {
        String::from_utf8_lossy(&self.cli_bytes(args)).into_owned()
    }

    pub fn cli_bytes(&self, args: &[&str]) -> Vec<u8> {
        Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "--raw"])
            .args(args)
            .output()
            .map(|o| o.stdout)
            .unwrap_or_default()
    }
}

impl Redis {
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
