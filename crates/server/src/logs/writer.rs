//! A log written by a thread of its own, so that no worker waits on the disk: lines are
//! handed over through a bounded queue, and a line that finds it full is dropped and
//! counted rather than holding up the request that made it (nginx's `access_log ...
//! buffer=` blocks the worker on write(2) when the buffer fills; a stalled disk stalls
//! nginx, never terminus). The thread writes what it has, then flushes whenever the queue
//! runs dry: lines reach the file within a batch of being made.
//!
//! Reopening (logrotate's rename, then SIGUSR1) is a flag the thread reads between
//! batches: every line lands in exactly one of the two files, the old one up to the
//! reopen and the new one after, none lost or written twice.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Lines a log holds for its thread: at a few hundred bytes a line, a few MiB, and a
/// second or more of a busy server's requests while the disk catches up.
pub(crate) const QUEUE_LINES: usize = 16_384;

/// How long shutdown waits for a log's thread to write what it holds.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Where a log goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Sink {
    Stdout,
    File(PathBuf),
}

/// What a log's lines came to, for the metrics.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) written: AtomicU64,
    /// Found the queue full (or the log closed).
    pub(crate) dropped: AtomicU64,
    /// Writes (and reopenings) the system refused.
    pub(crate) errors: AtomicU64,
}

impl Counts {
    pub(crate) const fn new() -> Self {
        Counts {
            written: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        }
    }
}

/// What the log's handles and its thread share.
#[derive(Debug, Default)]
struct Flags {
    reopen: AtomicBool,
    close: AtomicBool,
}

enum Message {
    Line(Vec<u8>),
    /// Look at the flags.
    Wake,
}

/// A handle to a log: cheap to clone, never blocks.
#[derive(Debug, Clone)]
pub(crate) struct Writer {
    queue: SyncSender<Message>,
    flags: Arc<Flags>,
    counts: &'static Counts,
}

/// The thread behind a log, to be closed at shutdown.
pub(crate) struct Thread {
    writer: Writer,
    handle: JoinHandle<()>,
    /// Told when the thread has written everything and ended.
    ended: Receiver<()>,
}

impl Writer {
    /// Opens `sink` (its errors are the caller's: a log that cannot be opened stops
    /// start-up, or keeps the running configuration on reload) and starts its thread,
    /// named `name`.
    pub(crate) fn open(
        sink: Sink,
        name: &str,
        counts: &'static Counts,
    ) -> io::Result<(Writer, Thread)> {
        let out = Output::open(&sink)?;
        let (queue, lines) = mpsc::sync_channel(QUEUE_LINES);
        let flags = Arc::new(Flags::default());
        let (done, ended) = mpsc::channel();
        let handle = {
            let flags = flags.clone();
            std::thread::Builder::new()
                .name(name.to_owned())
                .spawn(move || {
                    write_until_closed(out, &lines, &flags, counts);
                    let _ = done.send(());
                })?
        };
        let writer = Writer {
            queue,
            flags,
            counts,
        };
        let thread = Thread {
            writer: writer.clone(),
            handle,
            ended,
        };
        Ok((writer, thread))
    }

    /// Queues `line` (its newline included), or drops and counts it when the queue is
    /// full.
    pub(crate) fn send(&self, line: Vec<u8>) {
        if self.queue.try_send(Message::Line(line)).is_err() {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Asks the thread to reopen its file before its next batch.
    pub(crate) fn reopen(&self) {
        self.flags.reopen.store(true, Ordering::Release);
        self.wake();
    }

    fn wake(&self) {
        // A full queue needs no waking: the thread is busy and reads the flags after
        // its batch.
        match self.queue.try_send(Message::Wake) {
            Ok(()) | Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {}
        }
    }
}

impl Thread {
    /// The log's handle.
    pub(crate) fn writer(&self) -> &Writer {
        &self.writer
    }

    /// Writes what the queue holds, then ends the thread; waits for it up to
    /// [`CLOSE_WAIT`] (a disk that does not answer must not hold shutdown forever).
    pub(crate) fn close(self) {
        self.writer.flags.close.store(true, Ordering::Release);
        self.writer.wake();
        match self.ended.recv_timeout(CLOSE_WAIT) {
            Ok(()) => {
                let _ = self.handle.join();
            }
            Err(_) => eprintln!(
                "terminus: a log's thread did not finish writing within {CLOSE_WAIT:?}: its last lines may be lost"
            ),
        }
    }
}

/// The thread's loop: a batch is everything the queue holds, written, then flushed.
fn write_until_closed(mut out: Output, lines: &Receiver<Message>, flags: &Flags, counts: &Counts) {
    loop {
        // Woken for a line, a reopening or the close; the timeout only guards against a
        // wake lost to a full queue that then drained.
        match lines.recv_timeout(Duration::from_secs(1)) {
            Ok(message) => {
                out.take(message, counts);
                while let Ok(message) = lines.try_recv() {
                    out.take(message, counts);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                out.flush(counts);
                return;
            }
        }
        out.flush(counts);
        if flags.reopen.swap(false, Ordering::AcqRel) {
            out.reopen(counts);
        }
        if flags.close.load(Ordering::Acquire) {
            // Lines queued before the close was asked are in the queue still; lines
            // sent after it are the draining workers' last and are welcome too.
            while let Ok(message) = lines.try_recv() {
                out.take(message, counts);
            }
            out.flush(counts);
            return;
        }
    }
}

/// The open file (or standard output) and its buffer.
struct Output {
    sink: Sink,
    out: BufWriter<Box<dyn Write + Send>>,
    /// Whether the last write failed: an error is told once, not once a line.
    failing: bool,
}

impl Output {
    fn open(sink: &Sink) -> io::Result<Output> {
        Ok(Output {
            sink: sink.clone(),
            out: BufWriter::with_capacity(64 * 1024, open_sink(sink)?),
            failing: false,
        })
    }

    fn take(&mut self, message: Message, counts: &Counts) {
        if let Message::Line(line) = message {
            match self.out.write_all(&line) {
                Ok(()) => {
                    counts.written.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => self.failed("writing", &e, counts),
            }
        }
    }

    fn flush(&mut self, counts: &Counts) {
        match self.out.flush() {
            Ok(()) => self.failing = false,
            Err(e) => self.failed("writing", &e, counts),
        }
    }

    /// The file opened again at its path (the old one renamed away by logrotate); kept
    /// as it was when that fails.
    fn reopen(&mut self, counts: &Counts) {
        let Sink::File(path) = &self.sink else {
            return;
        };
        match open_file(path) {
            Ok(file) => {
                self.flush(counts);
                self.out = BufWriter::with_capacity(64 * 1024, Box::new(file));
                self.failing = false;
            }
            Err(e) => self.failed("reopening", &e, counts),
        }
    }

    /// Counted, and said on standard error once until a write succeeds again: not
    /// through the error log, which may be this very file.
    fn failed(&mut self, doing: &str, e: &io::Error, counts: &Counts) {
        counts.errors.fetch_add(1, Ordering::Relaxed);
        if !self.failing {
            self.failing = true;
            let what = match &self.sink {
                Sink::Stdout => "standard output".to_owned(),
                Sink::File(p) => p.display().to_string(),
            };
            eprintln!("terminus: {doing} the log {what}: {e}");
        }
        if doing == "writing" {
            // What the buffer held is lost with the failed write; start clean rather
            // than retry a partial line forever.
            let inner = std::mem::replace(
                &mut self.out,
                BufWriter::new(Box::new(io::sink()) as Box<dyn Write + Send>),
            );
            let (inner, _) = inner.into_parts();
            self.out = BufWriter::with_capacity(64 * 1024, inner);
        }
    }
}

fn open_sink(sink: &Sink) -> io::Result<Box<dyn Write + Send>> {
    Ok(match sink {
        Sink::Stdout => Box::new(io::stdout()),
        Sink::File(path) => Box::new(open_file(path)?),
    })
}

/// Appended to, created readable by the owner and group only (client addresses are
/// personal data; Debian's nginx and logrotate use 0640 too).
fn open_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("terminus-logs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn counts() -> &'static Counts {
        Box::leak(Box::new(Counts::new()))
    }

    fn numbered(text: &str) -> Vec<usize> {
        text.lines().map(|l| l.parse().unwrap()).collect()
    }

    #[test]
    fn reopening_after_a_rename_loses_and_repeats_no_line() {
        let d = dir("reopen");
        let path = d.join("access.log");
        let counts = counts();
        let (writer, thread) = Writer::open(Sink::File(path.clone()), "log-test", counts).unwrap();
        let sender = {
            let writer = writer.clone();
            std::thread::spawn(move || {
                for i in 0..20_000 {
                    writer.send(format!("{i}\n").into_bytes());
                    if i % 1000 == 0 {
                        std::thread::yield_now();
                    }
                }
            })
        };
        // Rotated while lines are being sent, as logrotate does under load.
        std::thread::sleep(Duration::from_millis(2));
        std::fs::rename(&path, d.join("access.log.1")).unwrap();
        writer.reopen();
        sender.join().unwrap();
        thread.close();
        let mut all = numbered(&std::fs::read_to_string(d.join("access.log.1")).unwrap());
        let after = numbered(&std::fs::read_to_string(&path).unwrap());
        all.extend(after);
        let dropped = counts.dropped.load(Ordering::Relaxed);
        assert_eq!(dropped, 0, "a fast disk keeps up");
        assert_eq!(
            all,
            (0..20_000).collect::<Vec<_>>(),
            "every line once, in order"
        );
        assert_eq!(counts.written.load(Ordering::Relaxed), 20_000);
    }

    #[test]
    fn a_stalled_file_drops_and_counts_lines_and_never_blocks_the_sender() {
        let d = dir("stall");
        let path = d.join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(made.success());
        // A reader that does not read: the pipe fills and the log's thread blocks in
        // write(2), as on a disk that stopped answering.
        let mut reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .unwrap();
        let counts = counts();
        let (writer, thread) = Writer::open(Sink::File(path.clone()), "log-test", counts).unwrap();
        let sent = QUEUE_LINES * 2 + 1000;
        let line = format!("{}\n", "x".repeat(255));
        let began = std::time::Instant::now();
        for _ in 0..sent {
            writer.send(line.clone().into_bytes());
        }
        let took = began.elapsed();
        let dropped = counts.dropped.load(Ordering::Relaxed);
        assert!(
            dropped >= (QUEUE_LINES as u64),
            "dropped {dropped} of {sent}"
        );
        assert!(
            took < Duration::from_secs(5),
            "sending took {took:?}: it blocked"
        );
        // The disk comes back: what was queued is written, and every line is either
        // written or counted dropped.
        let drain = std::thread::spawn(move || {
            let mut got = 0usize;
            let mut buf = vec![0u8; 1 << 16];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) => return got,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        });
        thread.close();
        let bytes = drain.join().unwrap();
        let written = counts.written.load(Ordering::Relaxed);
        assert_eq!(bytes, written as usize * line.len(), "whole lines only");
        assert_eq!(written + dropped, sent as u64);
    }
}
