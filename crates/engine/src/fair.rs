//! Which queued requests fill a batch when more wait than it holds: start-time fair
//! queueing (Goyal et al., SIGCOMM '96) between payers ([`crate::Payer`]: tenants),
//! weighted as they say (a tenant by its committed ACU), with every borrowed request
//! behind every committed one.
//!
//! Each request gets a tag when queued: its payer's virtual time, which advances by the
//! request's ACU cost over the payer's weight. A batch takes the lowest tags, so over any
//! busy period each payer's share of the computed ACU follows its weight, whatever its
//! key types, and a payer that floods the queue only lengthens its own line.
//! While no more requests wait than one batch holds, nothing is reordered.

use std::collections::HashMap;

use crate::context::HandshakeContext;
use crate::op::OpKind;
use crate::signing_key::KeyAlgorithm;

/// Where a request stands in line.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub(crate) struct Rank {
    /// Borrowed capacity waits for committed.
    borrowed: bool,
    /// Virtual start time.
    tag: f64,
}

impl Rank {
    /// The rank of a request nobody pays for (first in line, as before tenants).
    pub(crate) const FIRST: Rank = Rank {
        borrowed: false,
        tag: f64::NEG_INFINITY,
    };
}

/// One worker's virtual clocks.
#[derive(Default)]
pub(crate) struct Fair {
    /// The tag of the last request dispatched.
    now: f64,
    /// Each payer's next start tag, by its id.
    next: HashMap<usize, f64>,
}

impl Fair {
    /// Tags a request of `kind` signed with `key` for `ctx`'s payer.
    pub(crate) fn rank(
        &mut self,
        ctx: &HandshakeContext,
        kind: OpKind,
        key: Option<KeyAlgorithm>,
    ) -> Rank {
        let Some(payer) = ctx.payer() else {
            return Rank::FIRST;
        };
        let (cost, weight) = payer.cost_and_weight(kind, key);
        let id = payer.id();
        let next = self.next.entry(id).or_insert(self.now);
        let start = next.max(self.now);
        *next = start + cost / weight;
        Rank {
            borrowed: payer.borrowed(),
            tag: start,
        }
    }

    /// A request tagged `rank` was dispatched.
    pub(crate) fn dispatched(&mut self, rank: Rank) {
        if rank.tag.is_finite() {
            self.now = self.now.max(rank.tag);
        }
        // Payers that fell behind the clock start from it; forget them.
        if self.next.len() > 64 {
            let now = self.now;
            self.next.retain(|_, next| *next > now);
        }
    }
}

/// The positions in `ranks` of the `n` requests to dispatch first: the lowest ranks,
/// ties in queue order.
pub(crate) fn choose(ranks: &[Rank], n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..ranks.len()).collect();
    order.sort_by(|&a, &b| {
        ranks[a]
            .partial_cmp(&ranks[b])
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
    order.truncate(n);
    order.sort_unstable();
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KeyAlgorithm, OpKind, Payer};

    fn rank(borrowed: bool, tag: f64) -> Rank {
        Rank { borrowed, tag }
    }

    #[test]
    fn committed_requests_go_before_borrowed_ones_then_by_tag() {
        let ranks = [
            rank(true, 0.0),
            rank(false, 3.0),
            rank(false, 1.0),
            rank(true, -1.0),
            Rank::FIRST,
        ];
        assert_eq!(choose(&ranks, 3), vec![1, 2, 4]);
        assert_eq!(choose(&ranks, 4), vec![1, 2, 3, 4]);
    }

    /// A payer of a given weight whose every request costs one unit.
    struct Weighted(usize, f64);

    impl Payer for Weighted {
        fn id(&self) -> usize {
            self.0
        }
        fn cost_and_weight(&self, _: OpKind, _: Option<KeyAlgorithm>) -> (f64, f64) {
            (1.0, self.1)
        }
        fn borrowed(&self) -> bool {
            false
        }
        fn charge(&self, _: OpKind, _: Option<KeyAlgorithm>) {}
    }

    /// Payers of `weights` flooding an engine whose batches never hold every request
    /// waiting: the share of batch slots each gets.
    fn shares(weights: &[f64]) -> Vec<f64> {
        let contexts: Vec<HandshakeContext> = weights
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let ctx = HandshakeContext::starting_now();
                ctx.charge_to(Weighted(i, *w));
                ctx
            })
            .collect();
        let mut fair = Fair::default();
        // Each payer keeps 16 requests queued; batches of 8 are taken.
        let mut queue: Vec<(usize, Rank)> = Vec::new();
        let mut served = vec![0u32; weights.len()];
        for _ in 0..2000 {
            for (t, ctx) in contexts.iter().enumerate() {
                while queue.iter().filter(|(owner, _)| *owner == t).count() < 16 {
                    queue.push((t, fair.rank(ctx, OpKind::X25519, None)));
                }
            }
            let ranks: Vec<Rank> = queue.iter().map(|(_, r)| *r).collect();
            for &i in choose(&ranks, 8).iter().rev() {
                let (owner, rank) = queue.remove(i);
                fair.dispatched(rank);
                served[owner] += 1;
            }
        }
        let all: u32 = served.iter().sum();
        served
            .iter()
            .map(|&n| f64::from(n) / f64::from(all))
            .collect()
    }

    #[test]
    fn shares_of_an_oversubscribed_engine_follow_the_weights() {
        let got = shares(&[1000.0, 3000.0]);
        assert!(
            (got[0] - 0.25).abs() <= 0.05 && (got[1] - 0.75).abs() <= 0.05,
            "{got:?}"
        );
    }

    #[test]
    fn equal_ranks_keep_queue_order() {
        let ranks = [rank(false, 1.0); 5];
        assert_eq!(choose(&ranks, 2), vec![0, 1]);
    }
}
