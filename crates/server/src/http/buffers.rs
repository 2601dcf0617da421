//! Large I/O buffers a worker lends for one operation and takes back after, so that a
//! connection between requests holds none: what nginx and HAProxy do for their idle
//! connections, whose buffers go back to a pool when the connection goes quiet.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

/// Buffers a worker keeps for the next borrower; more given back are freed. As many as
/// connections commonly copy at once: past that, an allocation per operation.
const KEEP: usize = 32;

thread_local! {
    /// A worker's free buffers (one worker per thread).
    static FREE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A buffer lent by the worker, given back when dropped (also when the operation using
/// it is cancelled).
pub(crate) struct Lent(Vec<u8>);

impl Lent {
    /// A buffer of `len` bytes, its contents what the last borrower left (zeros when
    /// new).
    pub(crate) fn of(len: usize) -> Lent {
        let mut buf = FREE
            .with(|free| free.borrow_mut().pop())
            .unwrap_or_default();
        buf.resize(len, 0);
        Lent(buf)
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        // Not kept once the thread's pool is gone (a worker ending).
        let _ = FREE.try_with(|free| {
            let mut free = free.borrow_mut();
            if free.len() < KEEP {
                free.push(buf);
            }
        });
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
        assert_eq!(FREE.with(|free| free.borrow().len()), KEEP);
    }
}
