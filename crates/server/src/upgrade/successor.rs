//! The new process's side of a handover: it shows its token, takes the sockets, says
//! when it is ready and when it serves, and reports why when it cannot start (so that
//! `terminus upgrade` prints it).

use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::metrics::UPGRADE;
use super::wire::Wire;
use super::{Entry, Inherited, ENV_GENERATION, ENV_KEY, ENV_SOCKET, ENV_TOKEN};

/// How long the old process has to send the sockets, and to answer `ready` and
/// `serving`: it answers at once unless it is gone.
const ANSWER: Duration = Duration::from_secs(10);

/// The conversation with the process this one replaces.
pub(crate) struct Successor {
    wire: Wire,
    /// This process's generation (the first process is 1).
    pub(crate) generation: u64,
}

impl Successor {
    /// Where this process was started by a handover: the sockets it was sent and the
    /// conversation to go on with. `None` otherwise.
    pub(crate) fn from_env() -> Result<Option<(Successor, Inherited)>, String> {
        let (Some(path), Ok(token)) = (std::env::var_os(ENV_SOCKET), std::env::var(ENV_TOKEN))
        else {
            return Ok(None);
        };
        let generation = std::env::var(ENV_GENERATION)
            .ok()
            .and_then(|g| g.parse().ok())
            .unwrap_or(2);
        let key = std::env::var(ENV_KEY).ok();
        // Not passed on to what this process starts (a successor of its own gets fresh
        // ones). Only the main thread runs yet, so nothing reads the environment
        // meanwhile. (/proc/<pid>/environ still shows the values it was started with,
        // to its own user and root: whoever may read it may connect to the socket too.)
        for name in [ENV_SOCKET, ENV_TOKEN, ENV_KEY, ENV_GENERATION] {
            std::env::remove_var(name);
        }
        let stream = UnixStream::connect(&path).map_err(|e| {
            format!(
                "upgrade: cannot reach the process to take over from at {}: {e}",
                path.to_string_lossy()
            )
        })?;
        let mut wire = Wire::new(stream);
        let receive = |wire: &mut Wire| -> std::io::Result<Inherited> {
            wire.send(&format!("successor {token} {}", std::process::id()), &[])?;
            let mut inherited = Inherited {
                control_path: Some(std::path::PathBuf::from(&path)),
                ..Inherited::default()
            };
            loop {
                let line = wire.line(ANSWER)?;
                if line == "end" {
                    return Ok(inherited);
                }
                if let Some(tickets) = line.strip_prefix("tickets ") {
                    let keys: Vec<(u64, bool, String)> = serde_json::from_str(tickets)
                        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
                    let kek = (key.as_deref())
                        .and_then(|hex| terminus_fleet::tickets::Kek::from_hex(hex).ok());
                    let keys = keys
                        .into_iter()
                        .filter_map(|(epoch, shared, hex)| Some((epoch, shared, unhex(&hex)?)))
                        .collect();
                    inherited.tickets = kek.map(|kek| (kek, keys));
                    continue;
                }
                let Some(manifest) = line.strip_prefix("sockets ") else {
                    return Err(std::io::Error::other(format!("unexpected {line:?}")));
                };
                let entries: Vec<Entry> = serde_json::from_str(manifest)
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
                let fds = wire.take_fds(entries.len())?;
                (inherited.sockets).extend(entries.into_iter().zip(fds.into_iter().map(Some)));
            }
        };
        let inherited = receive(&mut wire)
            .map_err(|e| format!("upgrade: taking the sockets over failed: {e}"))?;
        Ok(Some((Successor { wire, generation }, inherited)))
    }

    /// Every socket is held and every worker built: waits for the old process's word
    /// to start accepting.
    pub(crate) fn ready(&mut self) -> Result<(), String> {
        stall_while_told();
        let go = self
            .wire
            .send("ready", &[])
            .and_then(|()| self.wire.line(ANSWER));
        match go {
            Ok(line) if line == "go" => Ok(()),
            Ok(line) => Err(format!("upgrade: the old process answered {line:?}")),
            Err(e) => Err(format!("upgrade: the old process did not say go: {e}")),
        }
    }

    /// The workers accept: the old process may stop. What it answers does not matter
    /// any more (this process serves either way); the connection is kept to learn when
    /// it has exited ([`Predecessor`]).
    pub(crate) fn serving(mut self) -> Predecessor {
        let drained = self
            .wire
            .send("serving", &[])
            .and_then(|()| self.wire.line(ANSWER));
        if let Err(e) = drained {
            tracing::warn!("upgrade: the old process did not answer once this one served: {e}");
        }
        Predecessor(Some(self.wire))
    }

    /// Start-up failed: the old process is told why, and serves on.
    pub(crate) fn failed(&self, why: &str) {
        let why = why.replace('\n', " ");
        let _ = self.wire.send(&format!("failed {why}"), &[]);
    }
}

/// Test-only fault: a successor whose environment names a file here waits, while the
/// file exists (30 s at most), before it says it is ready: a new process half-way
/// through its start, for the test that kills one there.
const STALL_FAULT: &str = "TERMINUS_TEST_SUCCESSOR_STALL";

fn stall_while_told() {
    let Some(path) = std::env::var_os(STALL_FAULT) else {
        return;
    };
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while std::path::Path::new(&path).exists() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The process this one replaced, while it drains: its control connection stays open
/// until it exits.
pub(crate) struct Predecessor(Option<Wire>);

impl Predecessor {
    /// None: this process was not started by a handover.
    pub(crate) fn none() -> Self {
        Self(None)
    }

    /// Whether the process this one replaced is still draining; what it reported of
    /// its open connections goes to the metrics.
    pub(crate) fn draining(&mut self) -> bool {
        let Some(wire) = &mut self.0 else {
            return false;
        };
        // What it said since (a line a second), without waiting.
        loop {
            match wire.line(Duration::from_millis(1)) {
                Ok(line) => {
                    if let Some(open) = line.strip_prefix("draining ").and_then(|n| n.parse().ok())
                    {
                        UPGRADE.predecessor_connections(open);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return true,
                Err(_) => {
                    tracing::info!("upgrade: the process this one replaced has exited");
                    UPGRADE.predecessor_connections(0);
                    self.0 = None;
                    return false;
                }
            }
        }
    }
}

/// Bytes from hexadecimal digits (`None` if they are not).
fn unhex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}
