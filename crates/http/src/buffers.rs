//! Large I/O buffers a worker lends for one operation and takes back after, so that a
//! connection between requests holds none: what nginx and HAProxy do for their idle
//! connections, whose buffers go back to a pool when the connection goes quiet.

use std::ops::{Deref, DerefMut};

use terminus_tls::pool::FreeList;

/// Buffers a worker keeps for the next borrower; more given back are freed. As many as
/// connections commonly copy at once: past that, an allocation per operation.
const KEEP: usize = 32;

thread_local! {
    /// A worker's free buffers (one worker per thread).
    static FREE: FreeList<Vec<u8>> = const { FreeList::new(KEEP) };
    /// A worker's spare HTTP/1.1 request-head buffers (see [`lend_head`]).
    static HEADS: FreeList<Vec<u8>> = const { FreeList::new(KEEP) };
    /// A worker's spare HTTP/2 output buffers (see [`lend_output`]).
    static OUTPUT: FreeList<Vec<u8>> = const { FreeList::new(KEEP) };
}

/// What an HTTP/2 output buffer starts with: a pass's frames for a few streams.
const OUTPUT_CAPACITY: usize = 32 * 1024;

/// An output buffer for an HTTP/2 connection with frames to write, empty: a spare from
/// the worker if `buf` has none, so that a connection going quiet after each request
/// does not grow a new one from nothing each time.
pub(crate) fn lend_output(buf: &mut Vec<u8>) {
    if buf.capacity() == 0 {
        *buf = OUTPUT
            .try_with(FreeList::take)
            .ok()
            .flatten()
            .unwrap_or_else(|| Vec::with_capacity(OUTPUT_CAPACITY));
    }
}

/// Takes back an HTTP/2 connection's emptied output buffer as it goes quiet (one that
/// grew past twice its size goes back to the allocator).
pub(crate) fn give_back_output(buf: &mut Vec<u8>) {
    debug_assert!(buf.is_empty());
    let spare = std::mem::take(buf);
    if (OUTPUT_CAPACITY..=2 * OUTPUT_CAPACITY).contains(&spare.capacity()) {
        let _ = OUTPUT.try_with(|out| out.give(spare));
    }
}

/// A buffer lent by the worker, given back when dropped (also when the operation using
/// it is cancelled).
pub(crate) struct Lent(Vec<u8>);

impl Lent {
    /// A buffer of `len` bytes, its contents what the last borrower left (zeros when
    /// new).
    pub(crate) fn of(len: usize) -> Lent {
        let mut buf = FREE.with(FreeList::take).unwrap_or_default();
        buf.resize(len, 0);
        Lent(buf)
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        // Not kept once the thread's pool is gone (a worker ending).
        let _ = FREE.try_with(|free| free.give(buf));
    }
}

impl Deref for Lent {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl DerefMut for Lent {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

/// What a request-head buffer starts with: a typical head and the start of a body.
const HEAD_CAPACITY: usize = 4096;

/// Room in `buf` for a connection's next request-head bytes: a spare buffer from the
/// worker if `buf` has none, grown only when little room is left (a head in two segments
/// is not reallocated for its second). A connection gives its buffer back
/// ([`give_back_head`]) whenever it waits with nothing of a request read, so an idle one
/// holds none, and taking one is a pop rather than a 4 KiB malloc and free per
/// keep-alive request.
pub(crate) fn lend_head(buf: &mut Vec<u8>) {
    if buf.capacity() == 0 {
        if let Some(spare) = HEADS.try_with(FreeList::take).ok().flatten() {
            *buf = spare;
        }
    }
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(HEAD_CAPACITY);
    }
}

/// Takes an empty head buffer back from a connection about to wait; one that grew for a
/// large head goes back to the allocator.
pub(crate) fn give_back_head(buf: &mut Vec<u8>) {
    debug_assert!(buf.is_empty());
    let mut spare = std::mem::take(buf);
    if (HEAD_CAPACITY..=2 * HEAD_CAPACITY).contains(&spare.capacity()) {
        // The last request's head (its cookies, its Authorization) does not go on to
        // another connection's buffer: a 4 KiB memset per wait, about what the malloc
        // and free it saves would cost (not in the keep-alive figures measured before
        // it was added).
        spare
            .spare_capacity_mut()
            .fill(std::mem::MaybeUninit::new(0));
        let _ = HEADS.try_with(|heads| heads.give(spare));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_lent_again_and_the_pool_is_bounded() {
        let first = Lent::of(1024);
        let at = first.as_ptr();
        drop(first);
        let again = Lent::of(1024);
        assert_eq!(again.as_ptr(), at, "the buffer given back is lent again");
        drop(again);
        let many: Vec<Lent> = (0..KEEP + 8).map(|_| Lent::of(16)).collect();
        drop(many);
        assert_eq!(FREE.with(FreeList::len), KEEP);
    }

    #[test]
    fn head_buffers_are_given_back_empty_and_lent_again() {
        let mut buf = Vec::new();
        lend_head(&mut buf);
        assert!(buf.capacity() >= HEAD_CAPACITY);
        let at = buf.as_ptr();
        give_back_head(&mut buf);
        assert_eq!(buf.capacity(), 0, "a waiting connection holds no buffer");
        lend_head(&mut buf);
        assert_eq!(buf.as_ptr(), at, "the spare is lent again");
        buf.extend_from_slice(&[b'x'; 3 * HEAD_CAPACITY]);
        buf.clear();
        let before = HEADS.with(FreeList::len);
        give_back_head(&mut buf);
        assert_eq!(
            HEADS.with(FreeList::len),
            before,
            "a grown buffer is not kept"
        );
    }
}
