//! What on-the-fly compression may hold in memory. An encoder costs up to a MiB and a
//! half once it has taken in a window of text (measured here, at the default levels, as
//! a server's memory growth per stalled compressed HTTP/2 stream beyond an uncompressed
//! one's: zstd ~1.46 MiB with its 256 KiB window, brotli ~1.5 MiB, gzip ~430 KiB; see
//! it::compression), and a response holds its encoder as long as its client
//! takes to read it: an HTTP/2 client can open 128 streams, ask each for a large text,
//! and read nothing (a window of 1 byte), and a proxied event stream holds its encoder
//! for its whole life. So each response's encoder is reserved, at its measured cost,
//! against its connection's budget and its worker's; past either, the response goes out
//! uncompressed (as nginx's gzip does when its buffers are taken), and the reservation
//! is given back when the encoder ends.
//!
//! A worker is one thread, so the counts are plain cells shared through `Rc`.

use std::cell::Cell;
use std::rc::Rc;

use super::{Coding, Levels};

/// A connection's compression memory, at most: 5 zstd or brotli encoders at once, 18
/// gzip ones (a page's scripts and styles over one HTTP/2 connection are mostly sent
/// before the next asks).
pub const PER_CONNECTION: usize = 8 << 20;

/// A worker's, all its connections together: about 85 zstd encoders at once.
pub const PER_WORKER: usize = 128 << 20;

impl Coding {
    /// What one encoder of this coding holds at `levels`, with the input and output it
    /// keeps between polls (measured at the default levels: see the module's doc; brotli
    /// 5 and 6 hash into 1 and 2 MiB of buckets more than its default's).
    fn memory(self, levels: Levels) -> usize {
        match self {
            Coding::Zstd => 1536 << 10,
            Coding::Brotli if levels.brotli >= 6 => 3584 << 10,
            Coding::Brotli if levels.brotli == 5 => 2560 << 10,
            Coding::Brotli => 1536 << 10,
            Coding::Gzip => 448 << 10,
        }
    }
}

/// A worker's budget for compression memory.
#[derive(Debug)]
pub struct WorkerMemory {
    limit: usize,
    used: Cell<usize>,
}

impl WorkerMemory {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Rc<Self> {
        Rc::new(WorkerMemory {
            limit,
            used: Cell::new(0),
        })
    }

    /// How much is reserved now.
    pub fn used(&self) -> usize {
        self.used.get()
    }
}

/// A connection's budget, within its worker's.
#[derive(Debug)]
pub struct ConnectionMemory {
    worker: Rc<WorkerMemory>,
    limit: usize,
    used: Cell<usize>,
}

impl ConnectionMemory {
    /// A connection's budget of `limit` bytes, drawn from `worker`'s.
    pub fn new(worker: &Rc<WorkerMemory>, limit: usize) -> Rc<Self> {
        Rc::new(ConnectionMemory {
            worker: worker.clone(),
            limit,
            used: Cell::new(0),
        })
    }

    /// An encoder of `coding`'s memory at `levels`, if both budgets have it.
    pub fn reserve(self: &Rc<Self>, coding: Coding, levels: Levels) -> Option<Reserved> {
        let bytes = coding.memory(levels);
        let (mine, workers) = (self.used.get() + bytes, self.worker.used.get() + bytes);
        if mine > self.limit || workers > self.worker.limit {
            return None;
        }
        self.used.set(mine);
        self.worker.used.set(workers);
        Some(Reserved {
            from: self.clone(),
            bytes,
        })
    }
}

/// One encoder's memory, reserved until this is dropped.
#[derive(Debug)]
pub struct Reserved {
    from: Rc<ConnectionMemory>,
    bytes: usize,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        let c = &self.from;
        c.used.set(c.used.get() - self.bytes);
        c.worker.used.set(c.worker.used.get() - self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Levels = Levels {
        gzip: 2,
        brotli: 3,
        zstd: 3,
    };

    #[test]
    fn a_connection_gets_its_share_and_the_worker_bounds_them_all() {
        let worker = WorkerMemory::new(3 * Coding::Zstd.memory(L));
        let a = ConnectionMemory::new(&worker, 2 * Coding::Zstd.memory(L));
        let b = ConnectionMemory::new(&worker, 2 * Coding::Zstd.memory(L));
        let a1 = a.reserve(Coding::Zstd, L).unwrap();
        let _a2 = a.reserve(Coding::Zstd, L).unwrap();
        assert!(
            a.reserve(Coding::Zstd, L).is_none(),
            "past the connection's"
        );
        let _b1 = b.reserve(Coding::Zstd, L).unwrap();
        assert!(b.reserve(Coding::Zstd, L).is_none(), "past the worker's");
        drop(a1);
        assert!(b.reserve(Coding::Zstd, L).is_some(), "given back");
    }

    #[test]
    fn everything_reserved_is_given_back() {
        let worker = WorkerMemory::new(PER_WORKER);
        let c = ConnectionMemory::new(&worker, PER_CONNECTION);
        let held: Vec<_> = Coding::ALL
            .iter()
            .filter_map(|&k| c.reserve(k, L))
            .collect();
        assert!(worker.used() > 0);
        drop(held);
        assert_eq!(worker.used(), 0);
    }
}
