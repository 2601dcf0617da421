//! Handing a running terminus over to a new process, dropping nothing: how a new binary
//! (an `apt upgrade`) or a setting only a new process can take (`workers`, listeners,
//! `[admin]`, `[signer]`, ...) is put in force without refusing a connection.
//!
//! As nginx's binary upgrade, the running process starts its successor itself (so that
//! under systemd the successor is in the service's cgroup, and becomes its main process
//! by `MAINPID=`); as HAProxy's seamless reload, the successor takes the listening
//! sockets over a Unix socket (SCM_RIGHTS) instead of binding its own, so no SYN ever
//! meets a closed socket and nothing queued in one is lost:
//!
//! 1. `terminus upgrade` (or SIGUSR2) asks the running process on its control socket
//!    ([`control`]). It starts the binary at the path it was started from (the new one,
//!    after a package upgrade), with its own arguments, a one-time token and the control
//!    socket's path in its environment.
//! 2. The successor connects, shows the token, and is sent every listening socket with
//!    what it is for ([`Entry`]); it loads its configuration and starts as usual but takes
//!    each socket it wants from what it was sent ([`Inherited`]), binding only what is new.
//! 3. Ready to accept, it says so; the old process answers `go`; the successor accepts
//!    and says `serving`. Only then does the old process stop accepting (the sockets stay
//!    open: the successor holds them), tell systemd the new main PID, and drain what it
//!    has for `upgrade.drain`, as at shutdown.
//!
//! QUIC connections stay with the process that made them: the successor reads the UDP
//! sockets from the handover and passes back what is not its own over a Unix datagram
//! socket per endpoint ([`Kind::QuicInbox`], `terminus_quic::succession`).
//!
//! A successor that fails (its configuration, a socket it cannot bind, a crash, silence
//! past the deadline) changes nothing: the old process never stopped accepting, reports
//! why to whoever asked, and serves on. One upgrade at a time: a request while one is
//! under way, or to a process already draining, is refused with the reason.

pub mod client;
pub(crate) mod control;
pub(crate) mod metrics;
pub(crate) mod successor;
mod wire;

use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use serde::{Deserialize, Serialize};

/// The control socket the successor connects to (the environment's, so that a
/// configuration naming another one cannot part the two).
pub(crate) const ENV_SOCKET: &str = "TERMINUS_UPGRADE_SOCKET";
/// The token the successor shows: only the process started for it is sent sockets.
pub(crate) const ENV_TOKEN: &str = "TERMINUS_UPGRADE_TOKEN";
/// The key the session-ticket keys are sealed under on their way to the successor (64
/// hexadecimal digits; never on the control socket itself).
pub(crate) const ENV_KEY: &str = "TERMINUS_UPGRADE_KEY";
/// The successor's generation (the first process is 1).
pub(crate) const ENV_GENERATION: &str = "TERMINUS_GENERATION";

/// Where the control socket is when the configuration does not say: systemd's
/// `RuntimeDirectory=terminus`, the Debian package's unit.
pub const DEFAULT_SOCKET: &str = "/run/terminus/control.sock";

/// The binary a successor is started from: the path this process was started by
/// (`argv[0]`, made absolute against the working directory now) when it names one, as
/// nginx does, so that a symlink switched to a new release
/// (`/usr/local/bin/terminus -> /opt/terminus-1.3/terminus`) starts the new release;
/// else (a name found on `PATH`) the file the kernel ran, read now: symlinks resolved,
/// and before a package upgrade renames a new file over it (after it, the kernel names
/// the old one "(deleted)"). Either way the successor is what is at that path when the
/// upgrade starts: the new binary after `apt upgrade`.
pub(crate) fn binary() -> std::io::Result<std::path::PathBuf> {
    match std::env::args_os().next().map(std::path::PathBuf::from) {
        Some(named) if named.components().count() > 1 => Ok(std::env::current_dir()?.join(named)),
        _ => std::env::current_exe(),
    }
}

/// What a socket handed over is for.
#[derive(Serialize, Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Kind {
    /// A `listen` entry's TCP listener (TLS or plain), one per worker.
    Tcp,
    /// An `http3` listener's UDP socket, one per worker.
    Udp,
    /// Where a successor passes back the QUIC datagrams of the connections this process
    /// still serves: one per UDP socket (`terminus_quic::succession`).
    #[serde(rename = "quic-inbox")]
    QuicInbox,
    /// The admin listener.
    Admin,
    /// A `[signer]` listener, one per worker.
    Signer,
    /// The control socket itself.
    Control,
}

/// One socket handed over: what it is for, the address its configuration gave (port 0
/// included, so that the successor's same setting finds it) and the one bound, and the
/// worker that served it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) kind: Kind,
    pub(crate) configured: Option<SocketAddr>,
    pub(crate) bound: Option<SocketAddr>,
    pub(crate) worker: usize,
}

/// The old process's copies of every socket it would hand over (duplicates of the
/// workers' own, taken at start-up, before the workers took theirs).
#[derive(Default)]
pub(crate) struct Handover {
    sockets: Vec<(Entry, OwnedFd)>,
}

impl Handover {
    /// Keeps a copy of `socket` as `entry`.
    pub(crate) fn keep(&mut self, entry: Entry, socket: impl AsFd) -> std::io::Result<()> {
        let copy = socket.as_fd().try_clone_to_owned()?;
        self.sockets.push((entry, copy));
        Ok(())
    }

    fn entries(&self) -> impl Iterator<Item = (&Entry, BorrowedFd<'_>)> {
        self.sockets.iter().map(|(e, fd)| (e, fd.as_fd()))
    }
}

/// A session-ticket key on its way to a successor: its epoch, whether it came from the
/// fleet's store, and its material sealed under the handover's key.
pub(crate) type SealedTicketKey = (u64, bool, Vec<u8>);

/// The sockets a successor was sent, each taken at most once; what is left when it
/// starts serving (a listener its configuration dropped) is closed.
#[derive(Default)]
pub(crate) struct Inherited {
    sockets: Vec<(Entry, Option<OwnedFd>)>,
    /// The session-ticket keys the predecessor held, sealed under the handover's key.
    pub(crate) tickets: Option<(terminus_fleet::tickets::Kek, Vec<SealedTicketKey>)>,
    /// Where the predecessor's control socket is: taken over when this process's
    /// configuration names the same path.
    pub(crate) control_path: Option<std::path::PathBuf>,
}

impl Inherited {
    /// The sockets of `kind` configured at `configured`, in the workers' order.
    pub(crate) fn take(&mut self, kind: Kind, configured: Option<SocketAddr>) -> Vec<OwnedFd> {
        let mut found: Vec<(usize, OwnedFd)> = self
            .sockets
            .iter_mut()
            .filter(|(e, fd)| e.kind == kind && e.configured == configured && fd.is_some())
            .filter_map(|(e, fd)| fd.take().map(|fd| (e.worker, fd)))
            .collect();
        found.sort_by_key(|(worker, _)| *worker);
        found.into_iter().map(|(_, fd)| fd).collect()
    }

    /// How many sockets were sent and not taken.
    pub(crate) fn left(&self) -> usize {
        self.sockets.iter().filter(|(_, fd)| fd.is_some()).count()
    }
}
