//! Operation costs from the start-up measurement: what sets the multibuffer backend's
//! crossovers. Skips loudly on a CPU without AVX-512 IFMA where batches are timed.

use terminus_capacity::Capacity;
use terminus_engine::cost::{Crossovers, Operation, Workload};
use terminus_engine::{BackendKind, KxGroup};

fn skip_without_ifma() -> bool {
    !terminus_testkit::runs_with_ifma(terminus_engine::multibuffer::applicable())
}

/// The start-up measurement (`Capacity::quick`, what the server runs) gives the cost, so
/// the crossover, of every operation it timed batched, and no other.
#[test]
fn crossovers_are_set_from_the_start_up_measurement() {
    if skip_without_ifma() {
        return;
    }
    let crossovers = Crossovers::default();
    let workloads = [
        Workload::for_group(KxGroup::X25519).unwrap(),
        Workload::for_group(KxGroup::Secp256r1).unwrap(),
        Workload::generate(Operation::EcdsaP256).unwrap(),
        Workload::generate(Operation::Rsa2048).unwrap(),
    ];
    let refs: Vec<&Workload> = workloads.iter().collect();
    let capacity = Capacity::quick(BackendKind::Multibuffer, &refs).unwrap();
    let measured = capacity.costs();
    for (op, cost) in &measured {
        crossovers.set(*op, cost.crossover());
    }
    assert_eq!(measured.len(), 4);
    for (op, cost) in &measured {
        assert!(crossovers.is_measured(*op), "{op:?}");
        assert!(
            cost.scalar.as_nanos() > 0 && cost.batch.as_nanos() > 0,
            "{op:?} {cost:?}"
        );
        assert_eq!(crossovers.get(*op), cost.crossover(), "{op:?}");
    }
    // Where IFMA runs, an 8-lane RSA-2048 or X25519 call costs less than eight scalar
    // operations (crypto_mb's whole point): a full batch must go to crypto_mb.
    for op in [Operation::Rsa2048, Operation::X25519] {
        let (_, cost) = measured.iter().find(|(o, _)| *o == op).unwrap();
        assert!(
            cost.crossover() <= 8,
            "{op:?}: batching never pays? {cost:?}"
        );
    }
    assert!(!crossovers.is_measured(Operation::EcdhP384));
}

/// A scalar backend's measurement (on any CPU) has no batched rates: no crossover is set.
#[test]
fn a_scalar_measurement_sets_no_crossover() {
    let rsa = Workload::generate(Operation::Rsa2048).unwrap();
    let x25519 = Workload::for_group(KxGroup::X25519).unwrap();
    let scalar = Capacity::quick(BackendKind::Scalar, &[&rsa, &x25519]).unwrap();
    let crossovers = Crossovers::default();
    assert!(scalar.costs().is_empty());
    assert!(!crossovers.is_measured(Operation::X25519));
}
