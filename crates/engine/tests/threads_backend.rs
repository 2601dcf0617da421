//! The `threads` backend under more work than its threads take: a dispatch that finds the
//! offload queue full waits a bounded time, then the worker computes the operation itself
//! (a fallback, counted); no request fails, and every signature verifies.

use std::sync::Arc;

use aws_lc_rs::encoding::{AsDer, Pkcs8V1Der};
use aws_lc_rs::rsa::KeySize;
use aws_lc_rs::signature::{self, KeyPair, RsaKeyPair, UnparsedPublicKey};
use rustls::SignatureScheme;
use terminus_engine::{
    BackendKind, CryptoOp, CryptoOutput, EngineMetrics, EngineSpec, FallbackCause,
    HandshakeContext, OpKind, SigningKeyPair, ThreadPool,
};

#[test]
fn a_full_offload_queue_is_waited_on_then_computed_on_the_worker() {
    let generated = RsaKeyPair::generate(KeySize::Rsa3072).unwrap();
    let der = AsDer::<Pkcs8V1Der>::as_der(&generated).unwrap();
    let key = Arc::new(SigningKeyPair::from_der(der.as_ref()).unwrap());
    let public = generated.public_key().as_ref().to_vec();
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
                let (engine, key) = (engine.clone(), key.clone());
                tokio::task::spawn_local(async move {
                    let op = CryptoOp::Sign {
                        key,
                        scheme: SignatureScheme::RSA_PSS_SHA256,
                        message: format!("m{i}").into_bytes(),
                    };
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
