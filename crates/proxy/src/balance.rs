//! Choosing the server for a request: weighted round robin, least connections, or a hash
//! of the request, over the servers that are up; backups only when no primary is. The
//! state is a few atomics shared by every worker, so the spread is the configured one
//! across the whole process, not per worker.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::spec::Balance;
use crate::upstream::Server;

/// How many other hash values are tried when a key's server is down, before falling
/// back to round robin (nginx tries 20).
const REHASHES: u64 = 20;

#[derive(Debug)]
pub(crate) struct Balancer {
    kind: Balance,
    /// Primary servers' indexes in smooth weighted order: each appears `weight` times,
    /// interleaved, so a heavy server's turns are spread across the round.
    primary: Vec<usize>,
    backup: Vec<usize>,
    cursor: AtomicUsize,
}

impl Balancer {
    pub(crate) fn new(kind: Balance, servers: &[Server]) -> Self {
        let order = |backup: bool| {
            let chosen: Vec<(usize, u32)> = servers
                .iter()
                .enumerate()
                .filter(|(_, s)| s.spec.backup == backup)
                .map(|(i, s)| (i, s.spec.weight.max(1)))
                .collect();
            smooth_weighted_order(&chosen)
        };
        Balancer {
            kind,
            primary: order(false),
            backup: order(true),
            cursor: AtomicUsize::new(0),
        }
    }

    /// The server for a request, or none when every server is down or excluded.
    /// `key` is the request's hash key (hash balance only); `exclude` the server a
    /// first attempt failed on.
    pub(crate) fn choose(
        &self,
        servers: &[Server],
        key: Option<u64>,
        exclude: Option<usize>,
        now: u64,
    ) -> Option<usize> {
        let usable = |i: &usize| Some(*i) != exclude && servers[*i].health.is_up(now);
        [&self.primary, &self.backup]
            .into_iter()
            .find_map(|order| match (&self.kind, key) {
                (Balance::LeastConn, _) => self.least_conn(order, servers, usable),
                (Balance::Hash(_), Some(key)) => {
                    Self::hashed(order, key, usable).or_else(|| self.in_turn(order, usable))
                }
                _ => self.in_turn(order, usable),
            })
    }

    fn in_turn(&self, order: &[usize], usable: impl Fn(&usize) -> bool) -> Option<usize> {
        if order.is_empty() {
            return None;
        }
        let start = self.cursor.fetch_add(1, Ordering::Relaxed);
        (0..order.len())
            .map(|k| order[(start + k) % order.len()])
            .find(usable)
    }

    fn hashed(order: &[usize], key: u64, usable: impl Fn(&usize) -> bool) -> Option<usize> {
        if order.is_empty() {
            return None;
        }
        (0..=REHASHES)
            .map(|attempt| {
                let h = if attempt == 0 {
                    key
                } else {
                    hash(&(key, attempt))
                };
                order[(h % order.len() as u64) as usize]
            })
            .find(usable)
    }

    /// Fewest requests in progress per unit of weight; ties go in turn, so that an idle
    /// upstream still sees every server.
    fn least_conn(
        &self,
        order: &[usize],
        servers: &[Server],
        usable: impl Fn(&usize) -> bool,
    ) -> Option<usize> {
        let candidates: Vec<usize> = {
            let mut seen: Vec<usize> = order.iter().copied().filter(&usable).collect();
            seen.sort_unstable();
            seen.dedup();
            seen
        };
        if candidates.is_empty() {
            return None;
        }
        let start = self.cursor.fetch_add(1, Ordering::Relaxed);
        let mut best: Option<(usize, usize, u32)> = None;
        for k in 0..candidates.len() {
            let i = candidates[(start + k) % candidates.len()];
            let (active, weight) = (servers[i].active(), servers[i].spec.weight.max(1));
            // active/weight < best_active/best_weight, without division.
            let better = best.is_none_or(|(_, ba, bw)| {
                (active as u128) * (bw as u128) < (ba as u128) * (weight as u128)
            });
            if better {
                best = Some((i, active, weight));
            }
        }
        best.map(|(i, _, _)| i)
    }
}

/// A value's hash, the same in every process and run (a request's key goes to the same
/// server after a restart).
pub(crate) fn hash(value: &impl Hash) -> u64 {
    #[allow(deprecated)] // SipHash with fixed keys: stable, which is what is wanted here
    let mut h = std::hash::SipHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// nginx's smooth weighted round robin, unrolled into one round: each server appears
/// `weight` times, spread out (weights 5,1,1 give a a b a c a a, not a a a a a b c).
fn smooth_weighted_order(servers: &[(usize, u32)]) -> Vec<usize> {
    let total: i64 = servers.iter().map(|&(_, w)| w as i64).sum();
    let mut current = vec![0i64; servers.len()];
    let mut order = Vec::with_capacity(total as usize);
    for _ in 0..total {
        let mut best = 0;
        for (k, &(_, w)) in servers.iter().enumerate() {
            current[k] += w as i64;
            if current[k] > current[best] {
                best = k;
            }
        }
        current[best] -= total;
        order.push(servers[best].0);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{HashKey, ServerSpec};

    fn servers(specs: &[(u32, bool)]) -> Vec<Server> {
        specs
            .iter()
            .enumerate()
            .map(|(i, &(weight, backup))| {
                Server::new(
                    ServerSpec {
                        address: format!("127.0.0.1:{}", 1000 + i).parse().unwrap(),
                        host: None,
                        weight,
                        backup,
                    },
                    "t",
                    None,
                    &crate::ProxyMetrics::default(),
                )
            })
            .collect()
    }

    fn counts(b: &Balancer, s: &[Server], n: usize) -> Vec<usize> {
        let mut c = vec![0; s.len()];
        for _ in 0..n {
            c[b.choose(s, None, None, 0).unwrap()] += 1;
        }
        c
    }

    #[test]
    fn round_robin_follows_the_weights_smoothly() {
        assert_eq!(
            smooth_weighted_order(&[(0, 5), (1, 1), (2, 1)]),
            [0, 0, 1, 0, 2, 0, 0]
        );
        let s = servers(&[(1, false), (2, false), (1, true)]);
        let b = Balancer::new(Balance::RoundRobin, &s);
        assert_eq!(
            counts(&b, &s, 300),
            [100, 200, 0],
            "backups idle while primaries are up"
        );
        assert_eq!(
            b.choose(&s, None, Some(1), 0).map(|i| i != 1),
            Some(true),
            "an excluded server is skipped"
        );
    }

    #[test]
    fn backups_take_over_only_when_every_primary_is_down() {
        let s = servers(&[(1, false), (1, false), (1, true)]);
        let b = Balancer::new(Balance::RoundRobin, &s);
        let spec = crate::spec::Health {
            fails: 1,
            interval: std::time::Duration::from_secs(60),
            check: None,
        };
        s[0].health.failed(&spec);
        let now = crate::health::now_ms();
        assert!((0..10).all(|_| b.choose(&s, None, None, now) == Some(1)));
        s[1].health.failed(&spec);
        assert!((0..10).all(|_| b.choose(&s, None, None, now) == Some(2)));
        s[2].health.failed(&spec);
        assert_eq!(b.choose(&s, None, None, now), None);
    }

    #[test]
    fn least_conn_prefers_the_least_busy_per_weight() {
        let s = servers(&[(1, false), (2, false)]);
        let b = Balancer::new(Balance::LeastConn, &s);
        (0..3).for_each(|_| s[0].enter());
        assert_eq!(b.choose(&s, None, None, 0), Some(1));
        (0..6).for_each(|_| s[1].enter());
        // 3/1 against 6/2: a tie, taken in turn.
        let picks: Vec<_> = (0..4)
            .map(|_| b.choose(&s, None, None, 0).unwrap())
            .collect();
        assert!(picks.contains(&0) && picks.contains(&1), "{picks:?}");
        s[1].enter();
        assert_eq!(b.choose(&s, None, None, 0), Some(0));
    }

    #[test]
    fn a_hash_key_sticks_to_its_server_and_moves_only_when_it_is_down() {
        let s = servers(&[(1, false), (1, false), (1, false), (1, false)]);
        let b = Balancer::new(Balance::Hash(HashKey::ClientIp), &s);
        let keys: Vec<u64> = (0..200u32).map(|k| hash(&k)).collect();
        let first: Vec<usize> = keys
            .iter()
            .map(|&k| b.choose(&s, Some(k), None, 0).unwrap())
            .collect();
        let again: Vec<usize> = keys
            .iter()
            .map(|&k| b.choose(&s, Some(k), None, 0).unwrap())
            .collect();
        assert_eq!(first, again);
        for server in 0..4 {
            let share = first.iter().filter(|&&i| i == server).count();
            assert!(
                (25..=75).contains(&share),
                "server {server}: {share} of 200"
            );
        }
        let spec = crate::spec::Health {
            fails: 1,
            interval: std::time::Duration::from_secs(60),
            check: None,
        };
        s[2].health.failed(&spec);
        let now = crate::health::now_ms();
        for (&k, &was) in keys.iter().zip(&first) {
            let now_on = b.choose(&s, Some(k), None, now).unwrap();
            assert_ne!(now_on, 2);
            if was != 2 {
                assert_eq!(now_on, was, "keys of servers that are up stay put");
            }
        }
    }
}
