//! `terminus upgrade`'s side of the control socket: one request, its progress lines,
//! and the outcome.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::wire::Wire;
use crate::{ServerOptions, StartError};

/// How long an upgrade may take from the request to the successor serving: its start
/// (the control thread's own deadline) and then some.
const UPGRADE: Duration = Duration::from_secs(90);

/// What a running terminus answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// The successor serves (`upgrade`), or the process serves (`status`): its pid
    /// and generation.
    Serving {
        /// Its process ID.
        pid: u32,
        /// Its generation (the first process is 1).
        generation: u64,
    },
    /// It refused, or the upgrade failed (the running process serves on): why.
    Refused(String),
}

/// The control socket of the terminus `options` configure: `upgrade.socket`, or the
/// default.
pub fn socket_of(options: &ServerOptions) -> Result<PathBuf, StartError> {
    let config = options.load_config()?;
    Ok(config
        .upgrade_socket
        .unwrap_or_else(|| PathBuf::from(super::DEFAULT_SOCKET)))
}

/// Why no answer came.
#[derive(Debug, PartialEq, Eq)]
pub enum Unanswered {
    /// Nothing answers on the socket (no terminus runs there, or one too old to take a
    /// handover): a restart is the way to put a new binary in force.
    Unreachable(String),
    /// It answered, then the conversation broke off or made no sense: what became of
    /// the upgrade is in the running process's log.
    Broken(String),
}

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unreachable(why) | Self::Broken(why) => f.write_str(why),
        }
    }
}

/// Asks the terminus answering on `socket` to hand over to a new process
/// (`upgrade`) or how it is (`status`); each progress line goes to `progress`.
pub fn ask(
    socket: &Path,
    command: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<Answer, Unanswered> {
    let stream = UnixStream::connect(socket).map_err(|e| {
        Unanswered::Unreachable(format!(
            "{}: {e} (is terminus running with this upgrade.socket?)",
            socket.display()
        ))
    })?;
    let broken =
        |e: &dyn std::fmt::Display| Unanswered::Broken(format!("{}: {e}", socket.display()));
    let mut wire = Wire::new(stream);
    wire.send(command, &[]).map_err(|e| broken(&e))?;
    loop {
        let line = wire.line(UPGRADE).map_err(|e| broken(&e))?;
        if let Some(rest) = line.strip_prefix("progress ") {
            progress(rest);
            continue;
        }
        if let Some(why) = line.strip_prefix("error ") {
            return Ok(Answer::Refused(why.to_owned()));
        }
        let mut words = line.split(' ');
        let (Some("ok" | "serving"), Some(pid), Some(generation), None) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            return Err(broken(&format!("unexpected answer {line:?}")));
        };
        return match (pid.parse(), generation.parse()) {
            (Ok(pid), Ok(generation)) => Ok(Answer::Serving { pid, generation }),
            _ => Err(broken(&format!("unexpected answer {line:?}"))),
        };
    }
}
