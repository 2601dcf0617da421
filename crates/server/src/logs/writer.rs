//! A log written by a thread of its own, so that no worker waits on the disk: lines are
//! handed over through a bounded queue, and a line that finds it full is dropped and
//! counted rather than holding up the request that made it (nginx's `access_log ...
//! buffer=` blocks the worker on write(2) when the buffer fills; a stalled disk stalls
//! nginx, never terminus). The queue is bounded in lines and in bytes: a client chooses
//! how long its request-target is, and must not choose how much memory a stalled disk
//! costs. The thread writes a batch, then flushes: lines reach the file within a batch
//! of being made.
//!
//! Reopening (logrotate's rename, then SIGUSR1) is a flag the thread reads between
//! batches, which are bounded so that a queue that never empties (a disk slower than the
//! traffic) still reopens: every line lands in exactly one of the two files, the old one
//! up to the reopen and the new one after, none lost or written twice.
//!
//! What the counts say is what happened to a line: `written` once the write(2) holding it
//! succeeded, `dropped` when the queue refused it or a failed write lost it.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Lines a log holds for its thread: a second or more of a busy server's requests while
/// the disk catches up.
pub(crate) const QUEUE_LINES: usize = 16_384;

/// Bytes a log holds for its thread at most, whatever the lines' lengths (a request
/// head may be 16 KiB): 8 MiB, at a few hundred bytes a line about the lines' bound.
pub(crate) const QUEUE_BYTES: usize = 8 << 20;

/// Lines written before the thread looks at its flags (reopen, close) again.
const BATCH: usize = 1024;

/// The buffer a batch is written from; written out whenever it fills.
const BUFFER: usize = 64 * 1024;

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
    /// Found the queue full (or the log closed), or lost to a failed write.
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
    /// Bytes of the lines in the queue.
    queued_bytes: AtomicUsize,
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
        let out = Output::open(sink)?;
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
    /// full (in lines or in bytes).
    pub(crate) fn send(&self, line: Vec<u8>) {
        let len = line.len();
        let queued = self.flags.queued_bytes.fetch_add(len, Ordering::Relaxed);
        if queued + len > QUEUE_BYTES || self.queue.try_send(Message::Line(line)).is_err() {
            self.flags.queued_bytes.fetch_sub(len, Ordering::Relaxed);
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Asks the thread to reopen its file before its next batch.
    pub(crate) fn reopen(&self) {
        self.flags.reopen.store(true, Ordering::Release);
        self.wake();
    }

    /// Whether any handle besides the registry's is left (a site's): a log no site
    /// names any more can be closed.
    pub(crate) fn in_use(&self) -> bool {
        // The registry's handle and the thread hold one each.
        Arc::strong_count(&self.flags) > 2
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
            Err(RecvTimeoutError::Disconnected) => {
                eprintln!("terminus: a log's thread ended without finishing: its last lines may be lost");
            }
            Err(RecvTimeoutError::Timeout) => eprintln!(
                "terminus: a log's thread did not finish writing within {CLOSE_WAIT:?}: its last lines may be lost"
            ),
        }
    }
}

/// The thread's loop: a batch is what the queue holds, up to [`BATCH`] lines, written;
/// then the flags.
fn write_until_closed(mut out: Output, lines: &Receiver<Message>, flags: &Flags, counts: &Counts) {
    loop {
        // Woken for a line, a reopening or the close; the timeout only guards against a
        // wake lost to a full queue that then drained.
        match lines.recv_timeout(Duration::from_secs(1)) {
            Ok(message) => {
                out.take(message, flags, counts);
                for _ in 1..BATCH {
                    match lines.try_recv() {
                        Ok(message) => out.take(message, flags, counts),
                        Err(_) => break,
                    }
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
                out.take(message, flags, counts);
            }
            out.flush(counts);
            return;
        }
    }
}

/// The open file (or standard output) and the batch being written to it.
struct Output {
    sink: Sink,
    out: Box<dyn Write + Send>,
    buffer: Vec<u8>,
    /// Lines in `buffer`: counted written once it is.
    lines: u64,
    /// A write failed after part of it may have reached the file: the next write starts
    /// with a newline, so that the torn line cannot run into the next.
    torn: bool,
    /// Whether the last write failed: an error is told once, not once a batch.
    failing: bool,
}

impl Output {
    fn open(sink: Sink) -> io::Result<Output> {
        Ok(Output {
            out: open_sink(&sink)?,
            sink,
            buffer: Vec::with_capacity(BUFFER),
            lines: 0,
            torn: false,
            failing: false,
        })
    }

    fn take(&mut self, message: Message, flags: &Flags, counts: &Counts) {
        if let Message::Line(line) = message {
            flags.queued_bytes.fetch_sub(line.len(), Ordering::Relaxed);
            if self.buffer.len() + line.len() > BUFFER {
                self.flush(counts);
            }
            if self.torn && self.buffer.is_empty() {
                self.buffer.push(b'\n');
            }
            self.buffer.extend_from_slice(&line);
            self.lines += 1;
        }
    }

    /// Writes the batch: its lines are written, or (the write failing) dropped.
    fn flush(&mut self, counts: &Counts) {
        if self.buffer.is_empty() {
            return;
        }
        let wrote = self
            .out
            .write_all(&self.buffer)
            .and_then(|()| self.out.flush());
        match wrote {
            Ok(()) => {
                counts.written.fetch_add(self.lines, Ordering::Relaxed);
                self.torn = false;
                self.failing = false;
            }
            Err(e) => {
                counts.dropped.fetch_add(self.lines, Ordering::Relaxed);
                self.torn = true;
                self.failed("writing", &e, counts);
            }
        }
        self.buffer.clear();
        self.lines = 0;
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
                self.out = Box::new(file);
                self.torn = false;
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
    use std::sync::atomic::AtomicUsize;

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

    fn mkfifo(path: &Path) {
        let made = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(made.success());
    }

    /// A FIFO's reading end, opened without waiting for a writer.
    fn read_end(path: &Path) -> File {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .unwrap()
    }

    /// Reads `fifo` until its writer closes, `pause` after each read (a slow disk); the
    /// bytes read, counted into `got` as they come. A FIFO no writer has opened yet reads
    /// as ended too: that end is believed once bytes have come, or after 10 s.
    fn drain(
        mut fifo: File,
        pause: Duration,
        got: Arc<AtomicUsize>,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            let began = std::time::Instant::now();
            loop {
                match fifo.read(&mut buf) {
                    Ok(0)
                        if got.load(Ordering::Relaxed) > 0
                            || began.elapsed() > Duration::from_secs(10) =>
                    {
                        return;
                    }
                    Ok(0) => std::thread::sleep(Duration::from_millis(1)),
                    Ok(n) => {
                        got.fetch_add(n, Ordering::Relaxed);
                        std::thread::sleep(pause);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        })
    }

    #[test]
    fn reopening_after_a_rename_loses_and_repeats_no_line() {
        let d = dir("reopen");
        let path = d.join("access.log");
        let counts = counts();
        let (writer, thread) = Writer::open(Sink::File(path.clone()), "log-test", counts).unwrap();
        // Half the lines, then the rename and the signal while the thread may still be
        // writing them, then the rest: fewer than the queue holds, so none is dropped.
        // The thread writes a batch to the file it has before it looks at the flag, and
        // looks after every batch of 1,024 at most: both files get lines.
        let (half_tx, half) = mpsc::channel::<()>();
        let (renamed_tx, renamed) = mpsc::channel::<()>();
        let sender = {
            let writer = writer.clone();
            std::thread::spawn(move || {
                for i in 0..12_000 {
                    if i == 6_000 {
                        half_tx.send(()).unwrap();
                        renamed.recv().unwrap();
                    }
                    writer.send(format!("{i}\n").into_bytes());
                }
            })
        };
        half.recv().unwrap();
        std::fs::rename(&path, d.join("access.log.1")).unwrap();
        writer.reopen();
        renamed_tx.send(()).unwrap();
        sender.join().unwrap();
        thread.close();
        let old = numbered(&std::fs::read_to_string(d.join("access.log.1")).unwrap());
        let new = numbered(&std::fs::read_to_string(&path).unwrap());
        assert!(
            !old.is_empty() && !new.is_empty(),
            "{} then {}",
            old.len(),
            new.len()
        );
        let all: Vec<usize> = old.into_iter().chain(new).collect();
        assert_eq!(counts.dropped.load(Ordering::Relaxed), 0);
        assert_eq!(
            all,
            (0..12_000).collect::<Vec<_>>(),
            "every line once, in order"
        );
        assert_eq!(counts.written.load(Ordering::Relaxed), 12_000);
    }

    #[test]
    fn a_queue_that_never_empties_still_reopens() {
        let d = dir("busy");
        let path = d.join("fifo");
        mkfifo(&path);
        // A disk slower than the traffic: 4 KiB a millisecond at most.
        let (old_bytes, new_bytes) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let reader = read_end(&path);
        let counts = counts();
        let (writer, thread) = Writer::open(Sink::File(path.clone()), "log-test", counts).unwrap();
        let old = drain(reader, Duration::from_millis(1), old_bytes.clone());
        let stop = Arc::new(AtomicBool::new(false));
        let line = format!("{}\n", "x".repeat(127));
        let sender = {
            let (writer, stop, line) = (writer.clone(), stop.clone(), line.clone());
            std::thread::spawn(move || {
                let mut sent = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    writer.send(line.clone().into_bytes());
                    sent += 1;
                }
                sent
            })
        };
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            counts.dropped.load(Ordering::Relaxed) > 0,
            "the queue is full"
        );
        std::fs::rename(&path, d.join("fifo.1")).unwrap();
        mkfifo(&path);
        let new = drain(read_end(&path), Duration::ZERO, new_bytes.clone());
        writer.reopen();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while new_bytes.load(Ordering::Relaxed) == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let reopened_while_busy = new_bytes.load(Ordering::Relaxed) > 0;
        stop.store(true, Ordering::Relaxed);
        let sent = sender.join().unwrap();
        thread.close();
        old.join().unwrap();
        new.join().unwrap();
        assert!(
            reopened_while_busy,
            "no line reached the new file while the queue was full"
        );
        let (written, dropped) = (
            counts.written.load(Ordering::Relaxed),
            counts.dropped.load(Ordering::Relaxed),
        );
        let bytes = old_bytes.load(Ordering::Relaxed) + new_bytes.load(Ordering::Relaxed);
        assert_eq!(bytes, written as usize * line.len(), "whole lines only");
        assert_eq!(written + dropped, sent);
    }

    #[test]
    fn a_stalled_file_drops_and_counts_lines_and_never_blocks_the_sender() {
        let d = dir("stall");
        let path = d.join("fifo");
        mkfifo(&path);
        // A reader that does not read: the pipe fills and the log's thread blocks in
        // write(2), as on a disk that stopped answering.
        let reader = read_end(&path);
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
        let got = Arc::new(AtomicUsize::new(0));
        let drained = drain(reader, Duration::ZERO, got.clone());
        thread.close();
        drained.join().unwrap();
        let written = counts.written.load(Ordering::Relaxed);
        assert_eq!(
            got.load(Ordering::Relaxed),
            written as usize * line.len(),
            "whole lines only"
        );
        assert_eq!(
            written + counts.dropped.load(Ordering::Relaxed),
            sent as u64
        );
    }

    #[test]
    fn long_lines_are_bounded_in_bytes_too() {
        let d = dir("bytes");
        let path = d.join("fifo");
        mkfifo(&path);
        let reader = read_end(&path);
        let counts = counts();
        let (writer, thread) = Writer::open(Sink::File(path.clone()), "log-test", counts).unwrap();
        // 32 KiB lines (a long request-target, escaped): the bytes' bound is reached
        // long before the lines'.
        let line = vec![b'x'; 32 * 1024];
        for _ in 0..1000 {
            writer.send(line.clone());
        }
        let queued = writer.flags.queued_bytes.load(Ordering::Relaxed);
        assert!(queued <= QUEUE_BYTES, "{queued} bytes queued");
        assert!(
            counts.dropped.load(Ordering::Relaxed) >= 1000 - (QUEUE_BYTES / line.len() + 16) as u64
        );
        let got = Arc::new(AtomicUsize::new(0));
        let drained = drain(reader, Duration::ZERO, got.clone());
        thread.close();
        drained.join().unwrap();
    }

    #[test]
    fn a_failed_write_counts_its_lines_dropped_and_never_joins_two_lines() {
        let d = dir("torn");
        let path = d.join("log");
        let counts = counts();
        let mut out = Output::open(Sink::File(path.clone())).unwrap();
        let flags = Flags::default();
        let line = |n: usize| format!("{{\"n\":{n}}}\n").into_bytes();
        out.take(Message::Line(line(1)), &flags, counts);
        out.flush(counts);
        // A write that fails after part of it reached the file, as a full disk does.
        out.out = Box::new(Torn(Some(open_file(&path).unwrap())));
        for n in 2..5 {
            flags
                .queued_bytes
                .fetch_add(line(n).len(), Ordering::Relaxed);
            out.take(Message::Line(line(n)), &flags, counts);
        }
        out.flush(counts);
        out.out = Box::new(open_file(&path).unwrap());
        out.take(Message::Line(line(5)), &flags, counts);
        out.flush(counts);
        assert_eq!(counts.written.load(Ordering::Relaxed), 2);
        assert_eq!(counts.dropped.load(Ordering::Relaxed), 3);
        let text = std::fs::read_to_string(&path).unwrap();
        let whole: Vec<&str> = text
            .lines()
            .filter(|l| l.ends_with('}') && l.starts_with('{'))
            .collect();
        assert_eq!(whole, ["{\"n\":1}", "{\"n\":5}"], "{text:?}");
    }

    /// Writes 3 bytes of what it is given, then fails.
    struct Torn(Option<File>);

    impl Write for Torn {
        fn write(&mut self, data: &[u8]) -> io::Result<usize> {
            match self.0.take() {
                Some(mut f) => f.write(&data[..3.min(data.len())]),
                None => Err(io::Error::other("no space left")),
            }
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
}
