//! A request body that can be sent again. A server may close an idle keep-alive
//! connection just as the proxy reuses it (the request crosses the server's FIN); the
//! request then fails before any byte of a response, and the server almost certainly
//! never saw it (when sending it again is allowed is `forward`'s rule). To send it again
//! on a fresh connection, or another server, the proxy needs the body it already
//! streamed out, so
//! each frame it reads is held ([`HOLD_LIMIT`] bytes at most, by reference count, not
//! copied) until the response begins. A body larger than that cannot be sent again once
//! any of it is out, as in HAProxy (whose L7 retries need the request in one buffer) and
//! Envoy (its retry buffer limit). What is held counts in the worker's request-body
//! budget ([`terminus_http::body::budget`]): a body that would take the worker past it
//! is not held either, so that requests stalled at an upstream cannot make a worker hold
//! more than its budget however many there are.

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use hyper::HeaderMap;
use terminus_http::body::budget;

/// The most body bytes held for sending again (beyond: not held, not resent).
pub const HOLD_LIMIT: usize = 64 * 1024;

/// A body read once from the client, resendable while what was read is held.
pub(crate) struct Replayable<B> {
    state: Rc<RefCell<State<B>>>,
    /// The next held frame this reader yields; past the held ones it reads the client's.
    next: usize,
}

/// The exchange's hold on a [`Replayable`] it gave to its request pump: the body back,
/// from its start, once the pump is gone.
pub(crate) struct Keeper<B>(Rc<RefCell<State<B>>>);

struct State<B> {
    inner: Pin<Box<B>>,
    held: Vec<Held>,
    held_bytes: usize,
    /// False once the body outgrew the limit or the response began.
    holding: bool,
    /// The client's body has ended.
    ended: bool,
    /// The whole body's, as the client's body gave it at first.
    hint: SizeHint,
}

enum Held {
    Data(Bytes),
    Trailers(HeaderMap),
}

impl<B: Body<Data = Bytes, Error = io::Error>> Replayable<B> {
    pub(crate) fn new(body: B) -> Self {
        let hint = body.size_hint();
        let ended = body.is_end_stream();
        Replayable {
            state: Rc::new(RefCell::new(State {
                inner: Box::pin(body),
                held: Vec::new(),
                held_bytes: 0,
                holding: true,
                ended,
                hint,
            })),
            next: 0,
        }
    }

    /// A body passed on without holding any of it: what goes where nothing is retried
    /// once sent (HTTP/2 upstreams, whose streams may be long).
    pub(crate) fn passing(body: B) -> Self {
        let passing = Self::new(body);
        passing.state.borrow_mut().holding = false;
        passing
    }

    pub(crate) fn keeper(&self) -> Keeper<B> {
        Keeper(self.state.clone())
    }
}

impl<B> Keeper<B> {
    /// The body from its start, if every frame read so far is held and no reader of it is
    /// left (the pump that sent it has been dropped).
    pub(crate) fn rewind(&self) -> Option<Replayable<B>> {
        let holding = self.0.borrow().holding;
        (holding && Rc::strong_count(&self.0) == 1).then(|| Replayable {
            state: self.0.clone(),
            next: 0,
        })
    }

    /// The response has begun: nothing will be sent again, so nothing more is held.
    pub(crate) fn release(&self) {
        self.0.borrow_mut().stop_holding();
    }
}

impl<B> State<B> {
    /// Nothing is held from now on: what was is dropped, its bytes back in the budget.
    fn stop_holding(&mut self) {
        self.holding = false;
        self.held = Vec::new();
        budget::give(std::mem::take(&mut self.held_bytes));
    }
}

impl<B> Drop for State<B> {
    fn drop(&mut self) {
        budget::give(self.held_bytes);
    }
}

impl<B: Body<Data = Bytes, Error = io::Error>> Body for Replayable<B> {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        let mut s = this.state.borrow_mut();
        if let Some(held) = s.held.get(this.next) {
            this.next += 1;
            return Poll::Ready(Some(Ok(match held {
                Held::Data(data) => Frame::data(data.clone()),
                Held::Trailers(map) => Frame::trailers(map.clone()),
            })));
        }
        if s.ended {
            return Poll::Ready(None);
        }
        let frame = match std::task::ready!(s.inner.as_mut().poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            None => {
                s.ended = true;
                return Poll::Ready(None);
            }
            Some(Err(e)) => {
                // What follows a failure is no body: nothing of it goes again.
                s.stop_holding();
                return Poll::Ready(Some(Err(e)));
            }
        };
        if s.holding {
            let held = if let Some(data) = frame.data_ref() {
                // Past the limit, or past the worker's budget: not held.
                let n = data.len();
                if s.held_bytes + n > HOLD_LIMIT || !budget::try_take(n) {
                    s.stop_holding();
                    return Poll::Ready(Some(Ok(frame)));
                }
                s.held_bytes += n;
                Held::Data(data.clone())
            } else if let Some(map) = frame.trailers_ref() {
                Held::Trailers(map.clone())
            } else {
                // A frame kind hyper may add later: not held, so not resendable.
                s.stop_holding();
                return Poll::Ready(Some(Ok(frame)));
            };
            s.held.push(held);
            this.next = s.held.len();
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        let s = self.state.borrow();
        self.next >= s.held.len() && (s.ended || s.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        if self.next == 0 {
            self.state.borrow().hint
        } else {
            SizeHint::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    fn body(pieces: &[&'static [u8]]) -> impl Body<Data = Bytes, Error = io::Error> {
        let frames: Vec<Result<Frame<Bytes>, io::Error>> = pieces
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    async fn read_all<B: Body<Data = Bytes, Error = io::Error>>(b: B) -> Vec<u8> {
        b.collect().await.unwrap().to_bytes().to_vec()
    }

    #[tokio::test]
    async fn a_body_partly_sent_is_resent_whole_from_its_start() {
        let mut first = Replayable::new(body(&[b"ab", b"cd", b"ef"]));
        let keeper = first.keeper();
        // The first attempt sent one frame, then its connection was found closed.
        let frame = first.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "ab");
        drop(first);
        let again = keeper.rewind().expect("held");
        assert_eq!(read_all(again).await, b"abcdef");
    }

    #[tokio::test]
    async fn a_body_sent_whole_is_resent_whole() {
        let first = Replayable::new(body(&[b"ab", b"cd"]));
        let keeper = first.keeper();
        assert_eq!(read_all(first).await, b"abcd");
        let again = keeper.rewind().expect("held");
        drop(keeper);
        let keeper = again.keeper();
        assert_eq!(read_all(again).await, b"abcd");
        assert_eq!(read_all(keeper.rewind().expect("held")).await, b"abcd");
    }

    #[tokio::test]
    async fn what_is_held_counts_in_the_workers_budget_and_nothing_is_held_past_it() {
        let first = Replayable::new(body(&[b"ab", b"cd"]));
        let keeper = first.keeper();
        assert_eq!(read_all(first).await, b"abcd");
        assert_eq!(budget::held(), 4);
        keeper.release();
        assert_eq!(budget::held(), 0, "released");

        let first = Replayable::new(body(&[b"ab"]));
        let keeper = first.keeper();
        assert_eq!(read_all(first).await, b"ab");
        drop(keeper);
        assert_eq!(budget::held(), 0, "dropped");

        // The worker's budget all but spent elsewhere: the body is sent, not held.
        assert!(budget::try_take(budget::WORKER_LIMIT - 3));
        let first = Replayable::new(body(&[b"ab", b"cd"]));
        let keeper = first.keeper();
        assert_eq!(read_all(first).await, b"abcd");
        assert!(keeper.rewind().is_none(), "over the budget: not held");
        assert_eq!(budget::held(), budget::WORKER_LIMIT - 3);
        budget::give(budget::WORKER_LIMIT - 3);
    }

    #[tokio::test]
    async fn nothing_is_resent_past_the_limit_or_while_a_reader_is_left_or_once_released() {
        static BIG: [u8; HOLD_LIMIT] = [7; HOLD_LIMIT];
        let first = Replayable::new(body(&[&BIG, b"x"]));
        let keeper = first.keeper();
        assert_eq!(read_all(first).await.len(), HOLD_LIMIT + 1);
        assert!(keeper.rewind().is_none(), "over the limit");

        let first = Replayable::new(body(&[b"ab"]));
        let keeper = first.keeper();
        assert!(keeper.rewind().is_none(), "the pump still holds a reader");

        let first = Replayable::new(body(&[b"ab"]));
        let keeper = first.keeper();
        keeper.release();
        drop(first);
        assert!(keeper.rewind().is_none(), "released");
    }
}
