//! Which queued requests fill a batch when more wait than it holds: start-time fair
//! queueing (Goyal et al., SIGCOMM '96) between tenants, weighted by their committed ACU
//! (tenants without a quota by what no quota has committed of the machine), with every
//! borrowed request behind every committed one.
//!
//! Each request gets a tag when queued: its tenant's virtual time, which advances by the
//! request's ACU cost over the tenant's weight. A batch takes the lowest tags, so over
//! any busy period each tenant's share of the computed ACU follows its weight, whatever
//! its key types, and a tenant that floods the queue only lengthens its own line.
//! While no more requests wait than one batch holds, nothing is reordered.

use std::collections::HashMap;

use crate::capacity::tenant::Class;
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
    /// The rank of a request outside any tenant (first in line, as before tenants).
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
    /// Each tenant's next start tag, by its account's address.
    next: HashMap<usize, f64>,
}

impl Fair {
    /// Tags a request of `kind` signed with `key` for `ctx`'s tenant.
    pub(crate) fn rank(
        &mut self,
        ctx: &HandshakeContext,
        kind: OpKind,
        key: Option<KeyAlgorithm>,
    ) -> Rank {
        let Some((account, class)) = ctx.tenant() else {
            return Rank::FIRST;
        };
        let (cost, weight) = account.cost_and_weight(kind, key);
        let id = std::sync::Arc::as_ptr(account) as usize;
        let next = self.next.entry(id).or_insert(self.now);
        let start = next.max(self.now);
        *next = start + cost / weight;
        Rank {
            borrowed: class == Class::Borrowed,
            tag: start,
        }
    }

    /// A request tagged `rank` was dispatched.
    pub(crate) fn dispatched(&mut self, rank: Rank) {
        if rank.tag.is_finite() {
            self.now = self.now.max(rank.tag);
        }
        // Tenants that fell behind the clock start from it; forget them.
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

    /// Tenants flooding an engine whose batches never hold every request waiting: the
    /// share of batch slots (of ACU: every request here costs the same) each gets.
    fn shares(accounts: &[std::sync::Arc<crate::capacity::tenant::TenantAccount>]) -> Vec<f64> {
        use crate::capacity::tenant::{Admission, Arrival};
        let now = std::time::Instant::now();
        let context = |account: &std::sync::Arc<_>| {
            let mut ctx = HandshakeContext::new(now);
            let arrival = Arrival {
                estimate: 0.0,
                cheap: true,
                idle: true,
            };
            let Admission::Now(hold) =
                crate::capacity::tenant::TenantAccount::admit(account, now, arrival)
            else {
                panic!("within its quota");
            };
            ctx.charge_to(hold);
            ctx
        };
        let contexts: Vec<HandshakeContext> = accounts.iter().map(context).collect();
        let mut fair = Fair::default();
        // Each tenant keeps 16 requests queued; batches of 8 are taken.
        let mut queue: Vec<(usize, Rank)> = Vec::new();
        let mut served = vec![0u32; accounts.len()];
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

    fn quota(acu: f64) -> Option<crate::capacity::tenant::Quota> {
        Some(crate::capacity::tenant::Quota {
            acu,
            acu_peak: acu,
            scu: None,
            over_quota: crate::capacity::tenant::OverQuota::Queue,
            max_wait: std::time::Duration::from_secs(1),
        })
    }

    #[test]
    fn shares_of_an_oversubscribed_engine_follow_the_weights() {
        let tenants =
            crate::capacity::tenant::Tenants::new(crate::capacity::AcuCosts::unmeasured(1));
        let a = tenants.account("a", quota(1000.0));
        let b = tenants.account("b", quota(3000.0));
        let got = shares(&[a, b]);
        assert!(
            (got[0] - 0.25).abs() <= 0.05 && (got[1] - 0.75).abs() <= 0.05,
            "{got:?}"
        );
    }

    /// A tenant without a quota weighs what the quotas leave of the machine, not all of
    /// it (which would give it ~75 times a 20-ACU tenant's share).
    #[test]
    fn unmetered_traffic_weighs_the_capacity_nobody_was_promised() {
        let costs = crate::capacity::AcuCosts::unmeasured(1);
        let machine = costs.machine_acu();
        let tenants = crate::capacity::tenant::Tenants::new(costs);
        let paid = tenants.account("paid", quota(machine * 0.2));
        let unmetered = tenants.account("default", None);
        let got = shares(&[paid, unmetered]);
        assert!(
            (got[0] - 0.2).abs() <= 0.05,
            "{got:?} (machine {machine} ACU)"
        );
        // Everything committed: unmetered traffic keeps a small line of its own.
        let tenants =
            crate::capacity::tenant::Tenants::new(crate::capacity::AcuCosts::unmeasured(1));
        let paid = tenants.account("paid", quota(machine * 2.0));
        let unmetered = tenants.account("default", None);
        let got = shares(&[paid, unmetered]);
        assert!(got[1] > 0.0 && got[1] < 0.05, "{got:?}");
    }

    #[test]
    fn equal_ranks_keep_queue_order() {
        let ranks = [rank(false, 1.0); 5];
        assert_eq!(choose(&ranks, 2), vec![0, 1]);
    }
}
