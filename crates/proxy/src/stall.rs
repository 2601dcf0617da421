//! How long a response body from an upstream may go without a byte (`timeouts.idle`),
//! the same for HTTP/1.1 connections and HTTP/2 streams: a server that stops mid-body
//! must not hold the client's response, and the proxy's memory, open for ever.

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::time::Duration;

/// A body's stall timer: made the first time the body has to wait (most small responses
/// never do), pushed back on every byte.
#[derive(Debug)]
pub(crate) struct Stall {
    idle: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Stall {
    pub(crate) fn new(idle: Duration) -> Self {
        Stall { idle, timer: None }
    }

    /// The longest wait allowed.
    pub(crate) fn idle(&self) -> Duration {
        self.idle
    }

    /// The body has nothing now: whether it has had nothing for `idle` (the timer is
    /// armed and wakes `cx` otherwise).
    pub(crate) fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let idle = self.idle;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        timer.as_mut().poll(cx).is_ready()
    }

    /// Bytes came.
    pub(crate) fn progressed(&mut self) {
        if let Some(timer) = &mut self.timer {
            timer
                .as_mut()
                .reset(tokio::time::Instant::now() + self.idle);
        }
    }
}
