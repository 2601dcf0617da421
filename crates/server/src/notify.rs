//! systemd's service notifications, written against the protocol (sd_notify(3): one
//! datagram of `KEY=VALUE` lines to the Unix socket `$NOTIFY_SOCKET`, `@` naming the
//! abstract namespace) rather than through libsystemd or a crate: it is a dozen lines,
//! and a missing socket is silence, never an error. Under `Type=notify` (or
//! `notify-reload`) systemd learns:
//!
//! - `READY=1` once every listener accepts (and again when a reload's configuration is
//!   live);
//! - `RELOADING=1` with `MONOTONIC_USEC` when a SIGHUP is taken;
//! - `STOPPING=1` when the drain begins;
//! - `MAINPID=` (with `READY=1`) when a successor serves after `terminus upgrade`: the
//!   service goes on in it, and this process drains unseen by systemd;
//! - `WATCHDOG=1` every half of `$WATCHDOG_USEC`, but only while every worker's event
//!   loop has run within the watchdog's time ([`Heartbeats`]): a wedged worker stops the
//!   pings, and systemd restarts the service (`WatchdogSec=`).
//!
//! Without `$NOTIFY_SOCKET` (not under systemd) every call does nothing.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where notifications go, if anywhere.
pub struct Notifier {
    socket: Option<(UnixDatagram, SocketAddr)>,
    /// `$WATCHDOG_USEC`, where it is meant for this process.
    watchdog: Option<Duration>,
}

impl Notifier {
    /// The notifier systemd's environment asks for: `$NOTIFY_SOCKET`, `$WATCHDOG_USEC`
    /// (if `$WATCHDOG_PID` is unset or this process).
    pub fn from_env() -> Self {
        let socket = std::env::var_os("NOTIFY_SOCKET").and_then(|path| {
            let address = address(path.as_encoded_bytes())?;
            let socket = UnixDatagram::unbound().ok()?;
            Some((socket, address))
        });
        let ours = std::env::var("WATCHDOG_PID")
            .ok()
            .is_none_or(|pid| pid.trim() == std::process::id().to_string());
        let watchdog = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|usec| usec.trim().parse::<u64>().ok())
            .filter(|&usec| ours && usec > 0)
            .map(Duration::from_micros);
        if socket.is_none() && std::env::var_os("NOTIFY_SOCKET").is_some() {
            tracing::warn!("NOTIFY_SOCKET is not a Unix socket path: systemd will not be told terminus is ready");
        }
        Notifier { socket, watchdog }
    }

    /// How often the watchdog is to be pinged (half its timeout, as sd_watchdog_enabled(3)
    /// advises), if systemd watches.
    pub fn watchdog_period(&self) -> Option<Duration> {
        self.socket.as_ref()?;
        self.watchdog.map(|w| w / 2)
    }

    /// Every listener accepts (at start, or a reload's configuration is live).
    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={status}\n"));
    }

    /// A reload begins (`notify-reload` needs the monotonic time it began).
    pub fn reloading(&self) {
        self.send(&format!(
            "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=reloading\n",
            terminus_sys::monotonic_usec()
        ));
    }

    /// A successor serves: it is the service's main process now (systemd follows it;
    /// this process's own notifications are no longer heard), and ready.
    pub fn handed_over(&self, pid: u32, generation: u64) {
        self.send(&format!(
            "MAINPID={pid}\nREADY=1\nSTATUS=serving (generation {generation}, after an upgrade)\n"
        ));
    }

    /// The drain begins.
    pub fn stopping(&self) {
        self.send("STOPPING=1\nSTATUS=draining\n");
    }

    /// Every worker is alive.
    pub fn watchdog(&self) {
        self.send("WATCHDOG=1\n");
    }

    fn send(&self, message: &str) {
        if let Some((socket, address)) = &self.socket {
            if let Err(e) = socket.send_to_addr(message.as_bytes(), address) {
                tracing::debug!("sd_notify {message:?}: {e}");
            }
        }
    }
}

/// `$NOTIFY_SOCKET`'s address: a path, or `@name` in the abstract namespace.
fn address(path: &[u8]) -> Option<SocketAddr> {
    match path.split_first() {
        Some((b'@', name)) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name).ok()
        }
        Some((b'/', _)) => {
            use std::os::unix::ffi::OsStrExt;
            SocketAddr::from_pathname(std::ffi::OsStr::from_bytes(path)).ok()
        }
        _ => None,
    }
}

/// How often a worker beats while systemd watches.
pub const BEAT: Duration = Duration::from_millis(500);

/// Test-only fault: worker 0's event loop blocks for good this many seconds after it
/// starts, as a wedged worker's would (the watchdog test's stalled worker).
pub const STALL_FAULT: &str = "TERMINUS_TEST_STALL_WORKER_AFTER";

/// When each worker's event loop last ran a beat, in milliseconds since `start`: the
/// watchdog's view of the workers.
pub struct Heartbeats {
    start: Instant,
    beats: Box<[AtomicU64]>,
}

impl Heartbeats {
    /// Beats for `workers` workers, every one counted as alive now.
    pub fn new(workers: usize) -> Arc<Self> {
        Arc::new(Heartbeats {
            start: Instant::now(),
            beats: (0..workers).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// Worker `id`'s event loop runs.
    pub fn beat(&self, id: usize) {
        if let Some(b) = self.beats.get(id) {
            b.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
        }
    }

    /// The workers whose last beat is older than `within`.
    pub fn stale(&self, within: Duration) -> Vec<usize> {
        let now = self.start.elapsed().as_millis() as u64;
        let within = within.as_millis() as u64;
        self.beats
            .iter()
            .enumerate()
            .filter(|(_, b)| now.saturating_sub(b.load(Ordering::Relaxed)) > within)
            .map(|(id, _)| id)
            .collect()
    }
}
