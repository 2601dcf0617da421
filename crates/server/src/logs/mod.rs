//! The logs terminus writes to files: the access log (a line per request or stream, in
//! `log.format`) and, where `log.error` names a file, the error log. Each file is
//! written by a thread of its own ([`writer`]) so that no worker waits on the disk, and
//! each is reopened on SIGUSR1 (nginx's and HAProxy's convention: logrotate renames the
//! file, then signals). A log file is opened once for the process, whatever number of
//! reloads name it: a reload naming a new file opens that one, and every file open is
//! reopened on the signal. Lines a client can cause at will are [`throttled`].

pub(crate) mod access;
pub(crate) mod throttled;
pub(crate) mod writer;

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use terminus_config::{AccessLogTarget, LogFormat};
use terminus_metrics::{Exposition, Kind, Labels, Render};

pub use access::AccessLog;
use writer::{Counts, Sink, Thread, Writer};

/// The access logs' lines, whichever file.
static ACCESS: Counts = Counts::new();
/// The error log's lines (when it is a file).
static ERROR: Counts = Counts::new();

/// Which log a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Access,
    Error,
}

/// Every log file open, and its thread.
static OPEN: Mutex<Vec<(Role, Sink, Thread)>> = Mutex::new(Vec::new());

/// The access log `target` names, written as `format`: the file's thread is started on
/// its first use and shared by every site that names it.
pub(crate) fn access(target: &AccessLogTarget, format: LogFormat) -> io::Result<Option<AccessLog>> {
    let sink = match target {
        AccessLogTarget::Off => return Ok(None),
        AccessLogTarget::Stdout => Sink::Stdout,
        AccessLogTarget::File(path) => Sink::File(path.clone()),
    };
    let writer = open(Role::Access, sink, "log-access", &ACCESS)?;
    Ok(Some(AccessLog::new(writer, format)))
}

/// What `terminus check` asks of the access log `target`: see [`check_file`].
pub(crate) fn check_access(target: &AccessLogTarget) -> io::Result<()> {
    match target {
        AccessLogTarget::File(path) => check_file(path),
        AccessLogTarget::Off | AccessLogTarget::Stdout => Ok(()),
    }
}

/// What `terminus check` asks of a log file: the file can be appended to, or its folder
/// exists; nothing is created, and no thread started.
pub(crate) fn check_file(path: &std::path::Path) -> io::Result<()> {
    match std::fs::OpenOptions::new().append(true).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let folder = path.parent().unwrap_or(std::path::Path::new("."));
            if folder.as_os_str().is_empty() || folder.is_dir() {
                Ok(())
            } else {
                Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("its folder {} does not exist", folder.display()),
                ))
            }
        }
        Err(e) => Err(e),
    }
}

fn open(role: Role, sink: Sink, name: &str, counts: &'static Counts) -> io::Result<Writer> {
    let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, _, thread)) = open.iter().find(|(r, s, _)| *r == role && *s == sink) {
        return Ok(thread.writer().clone());
    }
    let (writer, thread) = Writer::open(sink.clone(), name, counts)?;
    open.push((role, sink, thread));
    Ok(writer)
}

/// SIGUSR1: every log file is opened again at its path (once those no site names any
/// more are closed: a reopening must not bring back a file a reload left).
pub(crate) fn reopen() {
    release_unused();
    let open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    for (_, _, thread) in open.iter() {
        thread.writer().reopen();
    }
}

/// Closes the access logs no site names any more (a reload changed `log.access`, and
/// the connections of the sites that named them have ended).
pub(crate) fn release_unused() {
    let unused: Vec<Thread> = {
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        let (unused, kept) = std::mem::take(&mut *open)
            .into_iter()
            .partition(|(role, _, thread)| *role == Role::Access && !thread.writer().in_use());
        *open = kept;
        unused.into_iter().map(|(_, _, thread)| thread).collect()
    };
    for thread in unused {
        thread.close();
    }
}

/// The access logs' threads write what they hold and end: at shutdown, once the workers
/// (which make the lines) have stopped.
pub(crate) fn close_access() {
    close(Role::Access);
}

/// The error log's thread writes what it holds and ends: the last thing before the
/// process exits.
pub fn close_error() {
    close(Role::Error);
}

fn close(role: Role) {
    let closing: Vec<Thread> = {
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        let (closing, kept) = std::mem::take(&mut *open)
            .into_iter()
            .partition(|(r, _, _)| *r == role);
        *open = kept;
        closing.into_iter().map(|(_, _, thread)| thread).collect()
    };
    for thread in closing {
        thread.close();
    }
}

/// The threads that outlive the services, by name: the error log's, which writes until
/// the process exits.
pub(crate) const PROCESS_THREADS: &[&str] = &["log-error"];

/// The error log as a file: [`ErrorLog::line`] is what `tracing`'s formatter writes an
/// event into (a `MakeWriter` as a closure); the event is queued whole when it is
/// dropped.
#[derive(Debug, Clone)]
pub struct ErrorLog(Writer);

impl ErrorLog {
    /// Opens `path` for the error log, or says why it cannot be.
    pub fn open(path: &std::path::Path) -> io::Result<ErrorLog> {
        open(
            Role::Error,
            Sink::File(path.to_owned()),
            "log-error",
            &ERROR,
        )
        .map(ErrorLog)
    }

    /// A buffer for one event.
    pub fn line(&self) -> ErrorLine<'_> {
        ErrorLine {
            log: self,
            buf: Vec::with_capacity(256),
        }
    }
}

/// One error-log event, queued when dropped.
pub struct ErrorLine<'a> {
    log: &'a ErrorLog,
    buf: Vec<u8>,
}

impl io::Write for ErrorLine<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for ErrorLine<'_> {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            self.log.0.send(std::mem::take(&mut self.buf));
        }
    }
}

/// The logs' lines written, dropped (their queue full) and the write errors, by log.
pub(crate) struct LogMetrics;

impl Render for LogMetrics {
    fn render(&self, out: &mut Exposition) {
        let by_log = |pick: fn(&Counts) -> &AtomicU64| {
            [("access", &ACCESS), ("error", &ERROR)]
                .into_iter()
                .map(move |(log, counts)| {
                    (
                        Labels::of([("log", log)]),
                        pick(counts).load(Ordering::Relaxed),
                    )
                })
        };
        out.family(
            "terminus_log_lines_total",
            Kind::Counter,
            "Log lines written to their file, by log (the error log when it is a file).",
            by_log(|c| &c.written),
        );
        out.family(
            "terminus_log_lines_dropped_total",
            Kind::Counter,
            "Log lines dropped because the log's queue was full (its disk slower than the traffic): never a request held up for one.",
            by_log(|c| &c.dropped),
        );
        out.family(
            "terminus_log_write_errors_total",
            Kind::Counter,
            "Writes and reopenings of a log file the system refused, by log.",
            by_log(|c| &c.errors),
        );
    }
}
