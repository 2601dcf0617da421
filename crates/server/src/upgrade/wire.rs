//! The control socket's conversation: lines of text, some carrying descriptors
//! (SCM_RIGHTS, by `terminus_sys::fds`), each read with a deadline so that a peer that
//! stops talking is an error, never a hang.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// The longest line either side sends (a socket manifest's part is the longest).
const MAX_LINE: usize = 256 << 10;

/// One end of a control connection.
pub(crate) struct Wire {
    stream: UnixStream,
    buf: Vec<u8>,
    fds: VecDeque<OwnedFd>,
}

impl Wire {
    pub(crate) fn new(stream: UnixStream) -> Self {
        Self {
            stream,
            buf: Vec::new(),
            fds: VecDeque::new(),
        }
    }

    /// Sends `line` (no newline in it) and `fds` with it.
    pub(crate) fn send(&self, line: &str, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        debug_assert!(!line.contains('\n'));
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        terminus_sys::fds::send_with_fds(&self.stream, &bytes, fds)
    }

    /// The next line, within `deadline` of now: an error when the peer closed, went
    /// quiet past it, or sent a line too long or not UTF-8.
    pub(crate) fn line(&mut self, deadline: Duration) -> io::Result<String> {
        let until = Instant::now() + deadline;
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).take(end).collect();
                return String::from_utf8(line)
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8"));
            }
            if self.buf.len() > MAX_LINE {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"));
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer in time"));
            }
            self.stream.set_read_timeout(Some(left))?;
            let mut chunk = [0u8; 16 << 10];
            let mut fds = Vec::new();
            let n = match terminus_sys::fds::recv_with_fds(&self.stream, &mut chunk, &mut fds) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer in time"))
                }
                Err(e) => return Err(e),
            };
            self.fds.extend(fds);
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the other side closed the connection",
                ));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The descriptors received so far, in the order they were sent, `n` of them (an
    /// error if fewer came).
    pub(crate) fn take_fds(&mut self, n: usize) -> io::Result<Vec<OwnedFd>> {
        if self.fds.len() < n {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{n} descriptors announced, {} came", self.fds.len()),
            ));
        }
        Ok(self.fds.drain(..n).collect())
    }
}
