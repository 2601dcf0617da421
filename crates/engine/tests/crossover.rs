//! Crossovers obeyed by the multibuffer backend (a batch below its operation's crossover
//! is computed scalar, one at or above it in one call); their measurement is
//! terminus-capacity's (its tests/costs.rs).
//! Skips loudly on a CPU without AVX-512 IFMA.

mod common;

use std::sync::Arc;

use common::{on_multibuffer_engine, skip_without_ifma};
use terminus_engine::cost::{Cost, Crossovers, Operation};
use terminus_engine::{CryptoOp, CryptoOutput, HandshakeContext, KxGroup};

#[test]
fn crossover_is_the_ratio_of_call_to_scalar_cost_rounded_up() {
    let cost = |scalar_us: u64, batch_us: u64| Cost {
        scalar: std::time::Duration::from_micros(scalar_us),
        batch: std::time::Duration::from_micros(batch_us),
    };
    assert_eq!(cost(300, 1000).crossover(), 4);
    assert_eq!(cost(250, 1000).crossover(), 4);
    assert_eq!(cost(100, 150).crossover(), 2);
    assert_eq!(cost(100, 50).crossover(), 1);
    assert_eq!(cost(10, 1000).crossover(), 9, "never worth a call");
}

/// Submits `n` concurrent X25519 key generations with every handshake parked, so the
/// engine flushes them as one batch; returns (batches, scalar-computed) counts.
fn generate_batch(crossovers: Arc<Crossovers>, n: usize) -> (u64, u64) {
    on_multibuffer_engine(crossovers, |engine, metrics| async move {
        let _guards: Vec<_> = (0..n).map(|_| engine.handshake_started()).collect();
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let e = engine.clone();
                tokio::task::spawn_local(async move {
                    e.submit(
                        CryptoOp::KxGenerate {
                            group: KxGroup::X25519,
                        },
                        &HandshakeContext::starting_now(),
                    )
                    .await
                })
            })
            .collect();
        for t in tasks {
            assert!(matches!(t.await.unwrap(), Ok(CryptoOutput::KeyPair { .. })));
        }
        let kind = KxGroup::X25519.op_kind();
        (metrics.batches(kind), metrics.scalar_computed(kind))
    })
}

#[test]
fn backend_computes_batches_below_the_crossover_scalar() {
    if skip_without_ifma() {
        return;
    }
    let crossovers = Arc::new(Crossovers::default());
    crossovers.set(Operation::X25519, 5);
    assert_eq!(
        generate_batch(crossovers.clone(), 4),
        (1, 4),
        "4 < 5: scalar"
    );
    assert_eq!(generate_batch(crossovers.clone(), 5), (1, 0), "5: one call");
    crossovers.set(Operation::X25519, 9);
    assert_eq!(generate_batch(crossovers, 8), (1, 8), "never: all scalar");
}
