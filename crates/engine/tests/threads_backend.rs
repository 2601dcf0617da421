//! The `threads` backend under more work than its threads take: requests wait for room
//! in the engine's queue a bounded time, in fair order between tenants, then the worker
//! computes the next one itself (a fallback, counted); no request fails, and every
//! signature verifies.

use std::sync::Arc;

use aws_lc_rs::encoding::{AsDer, Pkcs8V1Der};
use aws_lc_rs::rsa::KeySize;
use aws_lc_rs::signature::{self, KeyPair, RsaKeyPair, UnparsedPublicKey};
use rustls::SignatureScheme;
use terminus_engine::{
    BackendKind, CryptoOp, CryptoOutput, EngineMetrics, EngineSpec, FallbackCause,
    HandshakeContext, KeyAlgorithm, OpKind, Payer, SigningKeyPair, ThreadPool,
};

/// A payer of a given weight (a tenant's committed ACU), every request costing one unit.
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

/// An RSA key, and its public half to verify with.
fn rsa(size: KeySize) -> (Arc<SigningKeyPair>, Vec<u8>) {
    let generated = RsaKeyPair::generate(size).unwrap();
    let der = AsDer::<Pkcs8V1Der>::as_der(&generated).unwrap();
    let key = Arc::new(SigningKeyPair::from_der(der.as_ref()).unwrap());
    (key, generated.public_key().as_ref().to_vec())
}

fn sign(key: &Arc<SigningKeyPair>, message: String) -> CryptoOp {
    CryptoOp::Sign {
        key: key.clone(),
        scheme: SignatureScheme::RSA_PSS_SHA256,
        message: message.into_bytes(),
    }
}

#[test]
fn a_full_offload_queue_is_waited_on_then_computed_on_the_worker() {
    let (key, public) = rsa(KeySize::Rsa3072);
    // One crypto thread, room for one waiting operation: a hundred RSA-3072 signatures
    // (about a millisecond each) keep it full far longer than a dispatch waits.
    let pool = ThreadPool::start(1, 1).unwrap();
    let metrics = Arc::new(EngineMetrics::new(BackendKind::Threads));
    let spec = EngineSpec {
        pool: Some(pool),
        ..EngineSpec::new(BackendKind::Threads)
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let results = tokio::task::LocalSet::new().block_on(&rt, async {
        let engine = spec.build(metrics.clone());
        let _guards: Vec<_> = (0..101).map(|_| engine.handshake_started()).collect();
        let tasks: Vec<_> = (0..100)
            .map(|i| {
                let (engine, op) = (engine.clone(), sign(&key, format!("m{i}")));
                tokio::task::spawn_local(async move {
                    engine.submit(op, &HandshakeContext::starting_now()).await
                })
            })
            .collect();
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        results
    });
    for (i, result) in results.into_iter().enumerate() {
        let Ok(CryptoOutput::Signature(sig)) = result else {
            panic!("request {i}: {result:?}")
        };
        UnparsedPublicKey::new(&signature::RSA_PSS_2048_8192_SHA256, &public)
            .verify(format!("m{i}").as_bytes(), &sig)
            .unwrap_or_else(|_| panic!("request {i} does not verify"));
    }
    let fell_back = metrics.fallbacks(OpKind::RsaSign, FallbackCause::QueueFull);
    assert!(fell_back > 0, "no dispatch gave up waiting");
    assert!(fell_back < 100, "the threads took none");
}

/// Two tenants weighted 1:3 (their committed ACU, far above what one thread computes)
/// each put 64 signatures before one crypto thread with room for one: while both still
/// have requests waiting, a quarter of those sent to be computed are the first tenant's. They wait
/// in the engine's fair queue, not in the pool's FIFO, where they would go 1:1 as queued.
#[test]
fn tenants_weighted_1_to_3_get_a_quarter_and_three_quarters_of_a_full_offload_queue() {
    let (key, public) = rsa(KeySize::Rsa2048);
    // Weighted as tenants with 1,000 and 3,000 committed ACU would be.
    let charged = |tenant: usize| {
        let ctx = HandshakeContext::starting_now();
        ctx.charge_to(Weighted(tenant, [1000.0, 3000.0][tenant]));
        ctx
    };
    let spec = EngineSpec {
        pool: Some(ThreadPool::start(1, 1).unwrap()),
        ..EngineSpec::new(BackendKind::Threads)
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let order = tokio::task::LocalSet::new().block_on(&rt, async {
        let engine = spec.build(Arc::new(EngineMetrics::new(BackendKind::Threads)));
        let _guard = engine.handshake_started();
        // Queued alternately, a then b, so that arrival order alone would give 1:1.
        let tasks: Vec<_> = (0..128)
            .map(|i| {
                let (engine, ctx) = (engine.clone(), charged(i % 2));
                let op = sign(&key, format!("m{i}"));
                tokio::task::spawn_local(async move {
                    let result = engine.submit(op, &ctx).await;
                    let dispatched = ctx.timeline().crypto[0].dispatched;
                    (i, result, dispatched.expect("dispatched").0)
                })
            })
            .collect();
        let mut order = Vec::new();
        for t in tasks {
            let (i, result, dispatched) = t.await.unwrap();
            let Ok(CryptoOutput::Signature(sig)) = result else {
                panic!("request {i}: {result:?}")
            };
            UnparsedPublicKey::new(&signature::RSA_PSS_2048_8192_SHA256, &public)
                .verify(format!("m{i}").as_bytes(), &sig)
                .unwrap_or_else(|_| panic!("request {i} does not verify"));
            order.push((dispatched, i % 2));
        }
        order.sort();
        order
            .into_iter()
            .map(|(_, tenant)| tenant)
            .collect::<Vec<_>>()
    });
    // The first 64 dispatched: b still had requests waiting for all of them (it had 64).
    let first_a = order[..64].iter().filter(|&&t| t == 0).count();
    let share = first_a as f64 / 64.0;
    assert!(
        (share - 0.25).abs() <= 0.05,
        "the first tenant had {first_a} of the first 64 signatures (its weight is 25%): {order:?}"
    );
}
