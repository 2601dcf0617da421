//! `crypto.simd = "dedicated"`: the multibuffer backend on a crypto thread pinned to a
//! core of its own, fed whole batches by several workers' engines. Every signature
//! verifies with aws-lc, none is computed on a worker, and the thread runs where it
//! was placed.

use std::sync::Arc;

use aws_lc_rs::encoding::{AsDer, Pkcs8V1Der};
use aws_lc_rs::rsa::KeySize;
use aws_lc_rs::signature::{self, KeyPair, RsaKeyPair, UnparsedPublicKey};
use rustls::SignatureScheme;
use terminus_engine::cost::Crossovers;
use terminus_engine::{
    BackendKind, CryptoOp, CryptoOutput, EngineMetrics, EngineSpec, FallbackCause,
    HandshakeContext, OpKind, SigningKeyPair, ThreadPool,
};

#[test]
fn two_workers_batches_are_signed_on_the_pinned_crypto_thread_and_verify() {
    if !terminus_testkit::runs_with_ifma(terminus_engine::multibuffer::applicable()) {
        return;
    }
    let generated = RsaKeyPair::generate(KeySize::Rsa2048).unwrap();
    let der = AsDer::<Pkcs8V1Der>::as_der(&generated).unwrap();
    let key = Arc::new(SigningKeyPair::from_der(der.as_ref()).unwrap());
    let public = generated.public_key().as_ref().to_vec();

    let cpu = *terminus_sys::allowed_cpus().unwrap().last().unwrap();
    let metrics = Arc::new(EngineMetrics::new(BackendKind::Multibuffer));
    let pool = ThreadPool::dedicated(
        &[cpu],
        1024,
        metrics.clone(),
        Arc::new(Crossovers::default()),
    )
    .unwrap();
    let threads = terminus_testkit::thread_cpus(std::process::id());
    let crypto: Vec<_> = threads
        .iter()
        .filter(|(name, _)| name.starts_with("crypto-simd"))
        .collect();
    assert_eq!(crypto, [&("crypto-simd-0".to_owned(), vec![cpu])]);
    let spec = EngineSpec {
        pool: Some(pool),
        ..EngineSpec::new(BackendKind::Multibuffer)
    };

    // Two workers, each with its own engine and event loop, 40 signatures each.
    let workers: Vec<_> = (0..2)
        .map(|w| {
            let (spec, key, metrics) = (spec.clone(), key.clone(), metrics.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .unwrap();
                tokio::task::LocalSet::new().block_on(&rt, async {
                    let engine = spec.build(metrics);
                    let _guard = engine.handshake_started();
                    let tasks: Vec<_> = (0..40)
                        .map(|i| {
                            let engine = engine.clone();
                            let op = CryptoOp::Sign {
                                key: key.clone(),
                                scheme: SignatureScheme::RSA_PSS_SHA256,
                                message: format!("w{w} m{i}").into_bytes(),
                            };
                            tokio::task::spawn_local(async move {
                                engine.submit(op, &HandshakeContext::starting_now()).await
                            })
                        })
                        .collect();
                    let mut signed = Vec::new();
                    for (i, t) in tasks.into_iter().enumerate() {
                        signed.push((format!("w{w} m{i}"), t.await.unwrap()));
                    }
                    signed
                })
            })
        })
        .collect();
    for worker in workers {
        for (message, result) in worker.join().unwrap() {
            let Ok(CryptoOutput::Signature(sig)) = result else {
                panic!("{message}: {result:?}")
            };
            UnparsedPublicKey::new(&signature::RSA_PSS_2048_8192_SHA256, &public)
                .verify(message.as_bytes(), &sig)
                .unwrap_or_else(|_| panic!("{message} does not verify"));
        }
    }
    for cause in FallbackCause::ALL {
        assert_eq!(
            metrics.fallbacks(OpKind::RsaSign, cause),
            0,
            "computed on a worker ({})",
            cause.name()
        );
    }
    assert_eq!(metrics.requests(OpKind::RsaSign), 80);
    assert!(
        metrics.scalar_computed(OpKind::RsaSign) < 80,
        "no signature was batched"
    );
}
