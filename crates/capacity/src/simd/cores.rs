//! How the allowed CPUs divide between workers and the
//! crypto threads of `crypto.simd = "dedicated"`.
//!
//! A frequency licence belongs to a physical core, so SMT siblings go together: a worker
//! on the sibling of a batching CPU would run at the batching CPU's clock.

/// The allowed CPUs divided: workers on some, crypto threads on the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// Where the workers run.
    pub workers: Vec<usize>,
    /// Where the crypto threads run, one thread per CPU.
    pub crypto: Vec<usize>,
}

/// `cores` whole physical cores of `allowed` for crypto threads, taken from the end (the
/// workers keep the first CPUs, as with `pin = true`), each with its siblings that are
/// allowed; `siblings` says which CPUs share a core. `None` when that would leave the
/// workers no CPU, or `cores` is 0.
pub fn split(
    allowed: &[usize],
    cores: usize,
    siblings: impl Fn(usize) -> Vec<usize>,
) -> Option<Split> {
    if cores == 0 {
        return None;
    }
    let mut crypto: Vec<usize> = Vec::new();
    let mut taken = 0;
    for &cpu in allowed.iter().rev() {
        if taken == cores {
            break;
        }
        if crypto.contains(&cpu) {
            continue;
        }
        let mut core: Vec<usize> = siblings(cpu)
            .into_iter()
            .filter(|c| allowed.contains(c) && !crypto.contains(c))
            .collect();
        if !core.contains(&cpu) {
            core.push(cpu);
        }
        crypto.extend(core);
        taken += 1;
    }
    crypto.sort_unstable();
    let workers: Vec<usize> = allowed
        .iter()
        .copied()
        .filter(|c| !crypto.contains(c))
        .collect();
    (taken == cores && !workers.is_empty()).then_some(Split { workers, crypto })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_smt(cpu: usize) -> Vec<usize> {
        vec![cpu]
    }

    /// Pairs (0,4), (1,5), (2,6), (3,7), as on a 4-core machine with SMT.
    fn pairs(cpu: usize) -> Vec<usize> {
        vec![cpu % 4, cpu % 4 + 4]
    }

    #[test]
    fn crypto_takes_the_last_cores_and_workers_the_rest() {
        let s = split(&[0, 1], 1, no_smt).unwrap();
        assert_eq!((s.workers, s.crypto), (vec![0], vec![1]));
        let s = split(&[0, 1, 2, 3, 4, 5, 6, 7], 2, no_smt).unwrap();
        assert_eq!((s.workers, s.crypto), (vec![0, 1, 2, 3, 4, 5], vec![6, 7]));
    }

    #[test]
    fn a_crypto_core_takes_its_smt_siblings_from_the_workers() {
        let all: Vec<usize> = (0..8).collect();
        let s = split(&all, 1, pairs).unwrap();
        assert_eq!((s.workers, s.crypto), (vec![0, 1, 2, 4, 5, 6], vec![3, 7]));
        // A sibling outside the affinity mask is not taken.
        let s = split(&[0, 1, 2, 3], 1, pairs).unwrap();
        assert_eq!((s.workers, s.crypto), (vec![0, 1, 2], vec![3]));
    }

    #[test]
    fn no_split_leaves_the_workers_without_a_cpu() {
        assert_eq!(split(&[0], 1, no_smt), None);
        assert_eq!(split(&[0, 1], 2, no_smt), None);
        assert_eq!(split(&[3, 7], 1, pairs), None, "one core, two siblings");
        assert_eq!(split(&[0, 1], 0, no_smt), None);
    }
}
