//! What a relay has moved each way and when it last moved anything, and the idle timeout
//! that follows from it: one mechanism for every relay, spliced in the kernel
//! ([`crate::ktls::splice_bidirectional`], [`crate::ktls::splice_plain`]) or copied
//! through user space (the proxy's WebSocket and `[[stream]]` relay).
//!
//! A relay notes each move ([`Activity::up`], [`Activity::down`]) and runs under
//! [`Activity::until_quiet`], which ends it once nothing has moved either way for the
//! idle timeout. Connections serving HTTP keep their own idle timers (a keep-alive timer
//! re-armed by requests), which are not relays' and are not kept here.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::time::{Duration, Instant};

/// Bytes moved each way, and when anything last moved.
#[derive(Debug)]
pub struct Activity {
    up: Cell<u64>,
    down: Cell<u64>,
    last: Cell<Instant>,
}

impl Default for Activity {
    fn default() -> Self {
        Self {
            up: Cell::new(0),
            down: Cell::new(0),
            last: Cell::new(Instant::now()),
        }
    }
}

impl Activity {
    /// `n` bytes moved from the client toward the upstream.
    pub fn up(&self, n: usize) {
        self.up.set(self.up.get() + n as u64);
        self.last.set(Instant::now());
    }

    /// `n` bytes moved from the upstream toward the client.
    pub fn down(&self, n: usize) {
        self.down.set(self.down.get() + n as u64);
        self.last.set(Instant::now());
    }

    /// The bytes moved so far: (toward the upstream, toward the client).
    pub fn moved(&self) -> (u64, u64) {
        (self.up.get(), self.down.get())
    }

    /// `relay`, ended with `TimedOut` once nothing has moved either way for `idle`.
    pub async fn until_quiet<T>(
        &self,
        relay: impl Future<Output = io::Result<T>>,
        idle: Duration,
    ) -> io::Result<T> {
        let quiet = async {
            loop {
                let since = self.last.get().elapsed();
                if since >= idle {
                    return;
                }
                tokio::time::sleep(idle - since).await;
            }
        };
        tokio::select! {
            ended = relay => ended,
            () = quiet => Err(io::Error::new(io::ErrorKind::TimedOut, format!("nothing moved for {idle:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A relay that keeps moving outlives the idle timeout, and one that stops is ended
    /// by it (on the real clock, which the moves are noted on).
    #[tokio::test]
    async fn only_a_relay_that_stops_moving_is_ended() {
        let activity = Activity::default();
        let idle = Duration::from_millis(200);
        let busy = async {
            for _ in 0..8 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                activity.down(1);
            }
            Ok(())
        };
        let ended = activity.until_quiet(busy, idle).await;
        assert!(
            ended.is_ok(),
            "a relay moving every 50 ms was cut: {ended:?}"
        );
        assert_eq!(activity.moved(), (0, 8));
        let started = Instant::now();
        let stalled = activity.until_quiet(std::future::pending::<io::Result<()>>(), idle);
        let ended = stalled.await.unwrap_err();
        assert_eq!(ended.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= idle, "{:?}", started.elapsed());
    }
}
