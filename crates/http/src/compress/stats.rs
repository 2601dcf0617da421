//! What compression has done, process-wide: responses compressed and bytes into and
//! out of the encoders, by coding (`terminus_compression_*` in the server's metrics:
//! the ratio an operator's traffic gets, and what it costs).

use std::sync::atomic::{AtomicU64, Ordering};

use terminus_metrics::{Exposition, Kind, Labels, Render};

use super::Coding;

/// The counters, one set for the process.
pub static STATS: Stats = Stats::new();

/// Per coding, in [`Coding::ALL`]'s order.
pub struct Stats {
    responses: [AtomicU64; 3],
    bytes_in: [AtomicU64; 3],
    bytes_out: [AtomicU64; 3],
    no_memory: AtomicU64,
}

impl Stats {
    const fn new() -> Self {
        Stats {
            responses: [const { AtomicU64::new(0) }; 3],
            bytes_in: [const { AtomicU64::new(0) }; 3],
            bytes_out: [const { AtomicU64::new(0) }; 3],
            no_memory: AtomicU64::new(0),
        }
    }

    pub(super) fn response(&self, coding: Coding) {
        self.responses[coding.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn no_memory(&self) {
        self.no_memory.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn compressed(&self, coding: Coding, bytes_in: usize, bytes_out: usize) {
        self.bytes_in[coding.index()].fetch_add(bytes_in as u64, Ordering::Relaxed);
        self.bytes_out[coding.index()].fetch_add(bytes_out as u64, Ordering::Relaxed);
    }
}

impl Render for Stats {
    fn render(&self, out: &mut Exposition) {
        let by_coding = |counters: &'static [AtomicU64; 3]| {
            Coding::ALL.into_iter().map(move |c| {
                (
                    Labels::of([("coding", c.token())]),
                    counters[c.index()].load(Ordering::Relaxed),
                )
            })
        };
        out.family(
            "terminus_compressed_responses_total",
            Kind::Counter,
            "Responses compressed on the fly, by coding (precompressed copies are not counted: nothing is compressed for them).",
            by_coding(&STATS.responses),
        );
        out.family(
            "terminus_compression_in_bytes_total",
            Kind::Counter,
            "Bytes given to the encoders, by coding.",
            by_coding(&STATS.bytes_in),
        );
        out.family(
            "terminus_compression_out_bytes_total",
            Kind::Counter,
            "Bytes the encoders made of them, by coding.",
            by_coding(&STATS.bytes_out),
        );
        out.header(
            "terminus_compression_no_memory_total",
            Kind::Counter,
            "Responses that would have been compressed, sent uncompressed because their connection's or worker's compression memory was taken.",
        );
        out.sample(
            "terminus_compression_no_memory_total",
            &Labels::NONE,
            STATS.no_memory.load(Ordering::Relaxed),
        );
    }
}
