//! A per-thread free list of record-sized buffers, lent to streams for one read or one
//! response.
//!
//! Why: most connections are idle most of the time, and an idle connection of
//! [`crate::SecureStream`] holds no buffer; it takes one when its socket has bytes or a
//! response is written, and gives it back as soon as it is done. Going to the allocator
//! for 16 KiB each time would cost a malloc and a free per request, and glibc returns
//! large chunks to the kernel lazily at best; a short free list makes the common case a
//! pop and a push. Each worker is a single thread with its own connections, so the list
//! is thread-local and unlocked. It is bounded (32 buffers, about half a MiB per
//! thread): what a burst of connections took beyond that goes back to the allocator
//! afterwards instead of staying on the list.

use std::cell::{Cell, RefCell};
use std::ops::{Deref, DerefMut};

use crate::record::MAX_RECORD_LEN;

/// Bytes of every buffer: one record of the largest size accepted, header included.
pub const BUF_LEN: usize = MAX_RECORD_LEN;
/// Free buffers kept per thread.
const MAX_FREE: usize = 32;

thread_local! {
    static FREE: FreeList<Box<[u8]>> = const { FreeList::new(MAX_FREE) };
    static LENT: Cell<usize> = const { Cell::new(0) };
}

/// A bounded free list, for a `thread_local!`: what [`Buffer`] lends from, and what other
/// per-request buffers of a worker (HTTP/1.1 head buffers) are kept on between requests.
pub struct FreeList<T> {
    items: RefCell<Vec<T>>,
    max: usize,
}

impl<T> FreeList<T> {
    /// An empty list that keeps at most `max` items.
    pub const fn new(max: usize) -> Self {
        Self {
            items: RefCell::new(Vec::new()),
            max,
        }
    }

    /// An item from the list, if it has one.
    pub fn take(&self) -> Option<T> {
        self.items.borrow_mut().pop()
    }

    /// Keeps `item` for the next [`FreeList::take`], or drops it if the list is full.
    pub fn give(&self, item: T) {
        let mut items = self.items.borrow_mut();
        if items.len() < self.max {
            items.push(item);
        }
    }

    /// Items on the list.
    pub fn len(&self) -> usize {
        self.items.borrow().len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.items.borrow().is_empty()
    }
}

/// A buffer of [`BUF_LEN`] bytes from this thread's list; it goes back when dropped.
/// Its bytes are what the last user left there: callers read only what they wrote.
pub struct Buffer {
    bytes: Box<[u8]>,
}

impl Buffer {
    /// Takes a buffer from this thread's list, or allocates one.
    pub fn take() -> Self {
        let bytes = FREE
            .with(FreeList::take)
            .unwrap_or_else(|| vec![0; BUF_LEN].into_boxed_slice());
        LENT.with(|lent| lent.set(lent.get() + 1));
        Self { bytes }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let bytes = std::mem::take(&mut self.bytes);
        // During the thread's teardown the list may be gone: the buffer is freed instead.
        let _ = LENT.try_with(|lent| lent.set(lent.get().saturating_sub(1)));
        let _ = FREE.try_with(|free| free.give(bytes));
    }
}

impl Deref for Buffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

/// Buffers this thread lent and has not had back.
pub fn lent() -> usize {
    LENT.with(Cell::get)
}

/// Buffers on this thread's free list.
pub fn free() -> usize {
    FREE.with(FreeList::len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_and_the_list_is_bounded() {
        let before = lent();
        let taken: Vec<Buffer> = (0..MAX_FREE + 8).map(|_| Buffer::take()).collect();
        assert_eq!(lent(), before + MAX_FREE + 8);
        assert!(taken.iter().all(|b| b.len() == BUF_LEN));
        drop(taken);
        assert_eq!(lent(), before);
        assert_eq!(free(), MAX_FREE);
        let again = Buffer::take();
        assert_eq!(free(), MAX_FREE - 1, "reused, not allocated");
        drop(again);
    }
}
