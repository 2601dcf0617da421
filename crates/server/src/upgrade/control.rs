//! The control socket (`upgrade.socket`, mode 0600): how `terminus upgrade` reaches a
//! running process, and the old side of a handover (the steps are in the module above).
//!
//! A client sends one line: `upgrade` (answered with progress lines, then `ok <pid>
//! <generation>` or `error <why>`) or `status` (`serving <pid> <generation>`). The
//! control thread does one thing at a time: while an upgrade is under way, any other
//! connection is answered `error` at once; once it has handed over, the successor
//! answers on the same socket.

use std::ffi::OsString;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use super::metrics::UPGRADE;
use super::successor::Predecessor;
use super::wire::Wire;
use super::{Handover, ENV_GENERATION, ENV_KEY, ENV_SOCKET, ENV_TOKEN};
use crate::service::Thread;

/// How long a successor may take from its start to being ready to accept: loading
/// certificates, measuring the machine for tenants' quotas, building every worker.
const START: Duration = Duration::from_secs(60);

/// How long a client has to send its line, and a successor to answer `go`.
const ANSWER: Duration = Duration::from_secs(10);

/// How long another client has to send its line while an upgrade is under way (the
/// control thread answers it before going on).
const OTHERS: Duration = Duration::from_secs(1);

/// How often the control thread looks for a connection, a SIGUSR2 or its stop.
const POLL: Duration = Duration::from_millis(20);

/// The control socket at `path`: `Ok(None)` when nothing is to listen (no path), an
/// error when another process answers there (a second terminus on the same socket) or
/// it cannot be bound. A socket file no process answers on (one left by a crash) is
/// replaced.
pub(crate) fn bind(path: &Path) -> Result<UnixListener, String> {
    // Made 0600 at once: whoever may connect may replace this process, so only its own
    // user (and root) may, from the first instant (nothing else makes files while the
    // listeners are bound).
    let bind = |path: &Path| terminus_sys::with_umask(0o177, || UnixListener::bind(path));
    let listener = match bind(path) {
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            if UnixStream::connect(path).is_ok() {
                return Err(format!(
                    "upgrade.socket {}: another process answers there (a terminus already running? `terminus upgrade` hands over to a new one)",
                    path.display()
                ));
            }
            // Only a socket file is taken for a stale one: anything else at the path is
            // the operator's, and the bind fails on it.
            use std::os::unix::fs::FileTypeExt;
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
                let _ = std::fs::remove_file(path);
            }
            bind(path)
        }
        bound => bound,
    }
    .map_err(|e| format!("upgrade.socket {}: {e}", path.display()))?;
    Ok(listener)
}

/// The old process's word that its successor serves: the main thread tells systemd
/// and drains.
pub(crate) struct HandedOver {
    pub(crate) pid: u32,
    pub(crate) generation: u64,
    /// The connection to the successor, held open until this process exits: how the
    /// successor learns that it has (it refuses to hand over again before), and where
    /// it hears how many connections this one still serves.
    connection: Wire,
    /// The successor, this process's child: reaped if it exits first.
    child: Child,
}

impl HandedOver {
    /// Tells the successor, every second until `done`, how many connections this
    /// process still has open (`open`): its metrics show the drain.
    pub(crate) fn report_drain(
        &mut self,
        open: impl Fn() -> u64,
        done: &std::sync::atomic::AtomicBool,
    ) {
        use std::sync::atomic::Ordering;
        while !done.load(Ordering::Relaxed) {
            if let Ok(Some(status)) = self.child.try_wait() {
                tracing::error!(
                    "upgrade: the new process (pid {}) exited ({status}) while this one drains",
                    self.pid
                );
                return;
            }
            if self
                .connection
                .send(&format!("draining {}", open()), &[])
                .is_err()
            {
                return;
            }
            for _ in 0..20 {
                if done.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// What the control socket is started with.
pub(crate) struct Settings {
    pub(crate) listener: UnixListener,
    pub(crate) path: PathBuf,
    /// Copies of every socket a successor is sent.
    pub(crate) handover: Handover,
    /// This process's generation.
    pub(crate) generation: u64,
    /// The process this one replaced, while it drains: no upgrade until it has exited.
    pub(crate) predecessor: Predecessor,
    /// The binary (as it was named when this process started: after a package upgrade,
    /// the new one) and the arguments a successor is started with.
    pub(crate) exe: PathBuf,
    pub(crate) args: Vec<OsString>,
    /// The session-ticket keys, handed over so that the tickets this process issued
    /// resume in the successor.
    pub(crate) tickets: std::sync::Arc<terminus_fleet::tickets::Ticketer>,
}

/// The main thread's side of the control thread.
pub(crate) struct Upgrades {
    /// Where the main thread hears of a handover.
    pub(crate) handed_over: mpsc::UnboundedReceiver<HandedOver>,
    /// Where it passes SIGUSR2 on.
    pub(crate) signal: std::sync::mpsc::Sender<()>,
}

/// What the control thread works with.
struct Control {
    settings: Settings,
    handed_over: mpsc::UnboundedSender<HandedOver>,
    signalled: std::sync::mpsc::Receiver<()>,
}

/// Runs the control socket on a thread of its own until it is stopped or has handed
/// over.
pub(crate) fn start(settings: Settings) -> io::Result<(Thread, Upgrades)> {
    settings.listener.set_nonblocking(true)?;
    let (handed_over, heard) = mpsc::unbounded_channel();
    let (signal, signalled) = std::sync::mpsc::channel();
    let control = Control {
        settings,
        handed_over,
        signalled,
    };
    let thread = Thread::spawn("control", move |stop| control.run(stop))?;
    Ok((
        thread,
        Upgrades {
            handed_over: heard,
            signal,
        },
    ))
}

impl Control {
    fn run(mut self, stop: watch::Receiver<bool>) {
        let mut ours = true;
        UPGRADE.generation(self.settings.generation);
        while !*stop.borrow() {
            // Its figures for the metrics, and its end noticed.
            self.settings.predecessor.draining();
            let handed = match self.settings.listener.accept() {
                Ok((stream, _)) => self.client(stream, &stop),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.signalled.try_recv().is_ok() {
                        self.upgrade(&stop, &mut |line| tracing::info!("SIGUSR2: {line}"))
                    } else {
                        std::thread::sleep(POLL);
                        false
                    }
                }
                Err(e) => {
                    tracing::warn!("upgrade.socket: accept: {e}");
                    std::thread::sleep(POLL);
                    false
                }
            };
            if handed {
                // The successor answers on this socket now, and owns its path.
                ours = false;
                break;
            }
        }
        if ours && *stop.borrow() {
            let _ = std::fs::remove_file(&self.settings.path);
        }
    }

    /// One client's request; true when it ended in a handover.
    fn client(&mut self, stream: UnixStream, stop: &watch::Receiver<bool>) -> bool {
        if stream.set_nonblocking(false).is_err() {
            return false;
        }
        let mut wire = Wire::new(stream);
        let Ok(line) = wire.line(ANSWER) else {
            return false;
        };
        match line.as_str() {
            "status" => {
                let _ = wire.send(
                    &format!(
                        "serving {} {}",
                        std::process::id(),
                        self.settings.generation
                    ),
                    &[],
                );
                false
            }
            "upgrade" => self.upgrade(stop, &mut |line| {
                let _ = wire.send(line, &[]);
            }),
            other if other.starts_with("successor ") => {
                let _ = wire.send("error no upgrade is under way", &[]);
                false
            }
            other => {
                let _ = wire.send(&format!("error unknown command {other:?}"), &[]);
                false
            }
        }
    }

    /// Hands over to a new process, saying how it goes on `say` (the last line `ok
    /// <pid> <generation>` or `error <why>`); true when the successor serves.
    fn upgrade(&mut self, stop: &watch::Receiver<bool>, say: &mut dyn FnMut(&str)) -> bool {
        if self.settings.predecessor.draining() {
            say("error the process this one replaced is still draining its connections (upgrade.drain); try again once it has exited");
            return false;
        }
        say(&format!(
            "progress starting {} (generation {})",
            self.settings.exe.display(),
            self.settings.generation + 1
        ));
        match self.hand_over(stop, say) {
            Ok((child, wire)) => {
                let pid = child.id();
                say(&format!("ok {pid} {}", self.settings.generation + 1));
                tracing::info!(
                    "upgrade: pid {pid} (generation {}) serves on every listener; this process (generation {}) stops accepting and drains",
                    self.settings.generation + 1,
                    self.settings.generation
                );
                let _ = self.handed_over.send(HandedOver {
                    pid,
                    generation: self.settings.generation + 1,
                    connection: wire,
                    child,
                });
                true
            }
            Err(why) => {
                UPGRADE.failed();
                tracing::error!("upgrade failed, this process serves on: {why}");
                say(&format!("error {why}"));
                false
            }
        }
    }

    fn hand_over(
        &mut self,
        stop: &watch::Receiver<bool>,
        say: &mut dyn FnMut(&str),
    ) -> Result<(Child, Wire), String> {
        let token = token();
        let key = random_hex(32);
        let mut child = Command::new(&self.settings.exe)
            .args(&self.settings.args)
            .env(ENV_SOCKET, &self.settings.path)
            .env(ENV_TOKEN, &token)
            .env(ENV_KEY, &key)
            .env(ENV_GENERATION, (self.settings.generation + 1).to_string())
            // systemd's watchdog settings name this process; the successor's own
            // are its once it is the main process.
            .env_remove("WATCHDOG_PID")
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.settings.exe.display()))?;
        let kek = terminus_fleet::tickets::Kek::from_hex(&key)
            .map_err(|e| format!("the handover's key: {e}"))?;
        let outcome = self.converse(&mut child, &token, &kek, stop, say);
        if outcome.is_err() {
            // Whatever it holds goes with it; this process never stopped accepting.
            let _ = child.kill();
            let _ = child.wait();
        }
        outcome.map(|wire| (child, wire))
    }

    fn converse(
        &mut self,
        child: &mut Child,
        token: &str,
        kek: &terminus_fleet::tickets::Kek,
        stop: &watch::Receiver<bool>,
        say: &mut dyn FnMut(&str),
    ) -> Result<Wire, String> {
        let pid = child.id();
        // Its connection, among any others (each told an upgrade is under way).
        let deadline = Instant::now() + START;
        let mut wire = loop {
            self.still_on(child, stop, deadline, "connect")?;
            match self.answer_others(token)? {
                Some(wire) => break wire,
                None => std::thread::sleep(POLL),
            }
        };
        say(&format!(
            "progress pid {pid} connected; sending the sockets"
        ));
        self.send_sockets(&wire, kek)
            .map_err(|e| format!("sending the sockets to pid {pid}: {e}"))?;
        // It starts (its configuration, certificates, workers), then says so.
        let line = self.next_line(&mut wire, child, token, stop, START, "start")?;
        match line.strip_prefix("failed ") {
            _ if line == "ready" => {}
            Some(why) => return Err(format!("the new process could not start: {why}")),
            None => return Err(format!("the new process said {line:?}")),
        }
        wire.send("go", &[])
            .map_err(|e| format!("the new process (pid {pid}) did not take go: {e}"))?;
        // It accepts from now on: a stop (SIGTERM) meanwhile no longer calls it off,
        // since that would kill a process clients are connecting to.
        let (_, committed) = watch::channel(false);
        let line = self.next_line(&mut wire, child, token, &committed, ANSWER, "serve")?;
        if line != "serving" {
            return Err(format!("the new process said {line:?} instead of serving"));
        }
        let _ = wire.send("drain", &[]);
        Ok(wire)
    }

    /// An error when terminus is stopping, the successor has exited, or `deadline`
    /// has passed for it to `what`.
    fn still_on(
        &self,
        child: &mut Child,
        stop: &watch::Receiver<bool>,
        deadline: Instant,
        what: &str,
    ) -> Result<(), String> {
        let pid = child.id();
        if *stop.borrow() {
            return Err("terminus is stopping".into());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "the new process (pid {pid}) exited ({status}) before taking over; its log says why"
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the new process (pid {pid}) did not {what} in time"
            ));
        }
        Ok(())
    }

    /// The successor's next line, within `within`, answering any other client
    /// meanwhile (an upgrade is under way): the control thread never leaves one
    /// waiting for as long as a successor takes to start.
    fn next_line(
        &mut self,
        wire: &mut Wire,
        child: &mut Child,
        token: &str,
        stop: &watch::Receiver<bool>,
        within: Duration,
        what: &str,
    ) -> Result<String, String> {
        let deadline = Instant::now() + within;
        loop {
            match wire.line(POLL) {
                Ok(line) => return Ok(line),
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                Err(e) => {
                    // Gone: its exit status says more than the closed connection.
                    std::thread::sleep(Duration::from_millis(100));
                    self.still_on(child, stop, deadline, what)?;
                    return Err(format!(
                        "the new process (pid {}) did not {what}: {e}",
                        child.id()
                    ));
                }
            }
            self.still_on(child, stop, deadline, what)?;
            if let Some(other) = self.answer_others(token)? {
                let _ = other.send("error a successor has already connected", &[]);
            }
        }
    }

    /// Takes one client waiting on the control socket, if any: the successor showing
    /// `token` is returned; any other is told an upgrade is under way.
    fn answer_others(&mut self, token: &str) -> Result<Option<Wire>, String> {
        let stream = match self.settings.listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(format!("upgrade.socket: accept: {e}")),
        };
        let _ = stream.set_nonblocking(false);
        let mut wire = Wire::new(stream);
        match wire.line(OTHERS) {
            Ok(line) if line.starts_with("successor ") && line.split(' ').nth(1) == Some(token) => {
                Ok(Some(wire))
            }
            Ok(line) if line.starts_with("successor ") => {
                let _ = wire.send("error wrong token", &[]);
                Ok(None)
            }
            _ => {
                let _ = wire.send("error an upgrade is under way", &[]);
                Ok(None)
            }
        }
    }

    /// Every socket, with what it is for, in messages of at most `MAX_FDS`.
    fn send_sockets(&self, wire: &Wire, kek: &terminus_fleet::tickets::Kek) -> io::Result<()> {
        let all: Vec<_> = self.settings.handover.entries().collect();
        for part in all.chunks(terminus_sys::fds::MAX_FDS) {
            let entries: Vec<_> = part.iter().map(|(e, _)| (*e).clone()).collect();
            let fds: Vec<_> = part.iter().map(|(_, fd)| *fd).collect();
            let manifest = serde_json::to_string(&entries).map_err(io::Error::other)?;
            wire.send(&format!("sockets {manifest}"), &fds)?;
        }
        // The control socket itself, so that the successor answers on it.
        let control = super::Entry {
            kind: super::Kind::Control,
            configured: None,
            bound: None,
            worker: 0,
        };
        let manifest = serde_json::to_string(&[control]).map_err(io::Error::other)?;
        wire.send(
            &format!("sockets {manifest}"),
            &[self.settings.listener.as_fd()],
        )?;
        // The session-ticket keys, each sealed under the handover's key (which only
        // the two processes' environments hold).
        let keys: Vec<(u64, bool, String)> = (self.settings.tickets.export(kek).into_iter())
            .map(|(epoch, shared, wrapped)| (epoch, shared, hex(&wrapped)))
            .collect();
        let keys = serde_json::to_string(&keys).map_err(io::Error::other)?;
        wire.send(&format!("tickets {keys}"), &[])?;
        wire.send("end", &[])
    }
}

/// A one-time token: 16 random bytes in hex (it only proves the successor is the
/// process started).
fn token() -> String {
    random_hex(16)
}

/// `n` random bytes (aws-lc's generator) in hex.
fn random_hex(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    aws_lc_rs::rand::fill(&mut bytes).expect("the system's random numbers");
    hex(&bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
