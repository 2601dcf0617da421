//! crypto_mb's batched X25519 against aws-lc-rs, and the multibuffer backend's handling
//! of mixed key-exchange requests. Skips loudly on a CPU without AVX-512 IFMA.

mod common;

use std::sync::Arc;

use aws_lc_rs::agreement::{self, UnparsedPublicKey};
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use common::skip_without_ifma;
use terminus_engine::multibuffer::x25519;
use terminus_engine::{
    scalar, BackendKind, CryptoError, CryptoOp, CryptoOutput, Engine, EngineMetrics, FlushPolicy,
    KxGroup, KxPrivateKey, MultibufferBackend, OpKind,
};

fn random_key() -> [u8; 32] {
    let mut k = [0u8; 32];
    SystemRandom::new().fill(&mut k).unwrap();
    k
}

fn aws_public(private: &[u8; 32]) -> Vec<u8> {
    let k = agreement::PrivateKey::from_private_key(&agreement::X25519, private).unwrap();
    k.compute_public_key().unwrap().as_ref().to_vec()
}

fn aws_shared(private: &[u8; 32], peer: &[u8]) -> Vec<u8> {
    let k = agreement::PrivateKey::from_private_key(&agreement::X25519, private).unwrap();
    agreement::agree(
        &k,
        UnparsedPublicKey::new(&agreement::X25519, peer),
        (),
        |s| Ok(s.to_vec()),
    )
    .unwrap()
}

#[test]
fn public_keys_and_secrets_match_aws_lc_for_every_lane_count() {
    if skip_without_ifma() {
        return;
    }
    for _round in 0..50 {
        for lanes in 1..=8 {
            let privs: Vec<[u8; 32]> = (0..lanes).map(|_| random_key()).collect();
            let refs: Vec<&[u8; 32]> = privs.iter().collect();
            let publics = x25519::public_keys(&refs);
            let peers: Vec<Vec<u8>> = (0..lanes).map(|_| aws_public(&random_key())).collect();
            let pairs: Vec<(&[u8; 32], &[u8])> = privs
                .iter()
                .zip(&peers)
                .map(|(k, p)| (k, p.as_slice()))
                .collect();
            let secrets = x25519::shared_secrets(&pairs);
            for i in 0..lanes {
                assert_eq!(
                    publics[i].unwrap().to_vec(),
                    aws_public(&privs[i]),
                    "{lanes} lanes, lane {i}"
                );
                assert_eq!(
                    secrets[i].as_ref().unwrap().to_vec(),
                    aws_shared(&privs[i], &peers[i])
                );
            }
        }
    }
}

#[test]
fn a_low_order_or_malformed_peer_fails_its_lane_only() {
    if skip_without_ifma() {
        return;
    }
    let privs: Vec<[u8; 32]> = (0..8).map(|_| random_key()).collect();
    let mut peers: Vec<Vec<u8>> = (0..8).map(|_| aws_public(&random_key())).collect();
    peers[2] = vec![0u8; 32]; // the identity: all-zero shared secret
    peers[5] = vec![9u8; 31]; // wrong length
    let pairs: Vec<(&[u8; 32], &[u8])> = privs
        .iter()
        .zip(&peers)
        .map(|(k, p)| (k, p.as_slice()))
        .collect();
    let secrets = x25519::shared_secrets(&pairs);
    for (i, s) in secrets.iter().enumerate() {
        match i {
            2 | 5 => assert!(s.is_err(), "lane {i} must fail"),
            _ => assert_eq!(
                s.as_ref().unwrap().to_vec(),
                aws_shared(&privs[i], &peers[i]),
                "lane {i}"
            ),
        }
    }
}

#[test]
fn backend_batches_mixed_exchanges_and_agrees_with_the_scalar_path() {
    if skip_without_ifma() {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    tokio::task::LocalSet::new().block_on(&rt, async {
        let metrics = Arc::new(EngineMetrics::new(BackendKind::Multibuffer));
        let backend = MultibufferBackend::new(metrics.clone()).unwrap();
        let engine = Engine::new(Box::new(backend), FlushPolicy::default(), metrics.clone());
        // A scalar-made key pair, to be completed by the batched path.
        let (scalar_private, scalar_public) = match scalar::compute(CryptoOp::KxGenerate {
            group: KxGroup::X25519,
        })
        .unwrap()
        {
            CryptoOutput::KeyPair {
                private_key,
                public,
            } => (private_key, public),
            other => panic!("{other:?}"),
        };
        assert!(matches!(scalar_private, KxPrivateKey::AwsLc(_)));
        let client = random_key();
        let client_public = aws_public(&client);
        let _guards: Vec<_> = (0..8).map(|_| engine.handshake_started()).collect();
        let mut ops = vec![CryptoOp::KxAgree {
            group: KxGroup::X25519,
            private_key: scalar_private,
            peer_public: client_public.clone(),
        }];
        ops.extend((0..4).map(|_| CryptoOp::KxGenerateAgree {
            group: KxGroup::X25519,
            peer_public: client_public.clone(),
        }));
        ops.extend((0..2).map(|_| CryptoOp::KxGenerate {
            group: KxGroup::X25519,
        }));
        ops.push(CryptoOp::KxGenerateAgree {
            group: KxGroup::X25519,
            peer_public: vec![0u8; 32],
        });
        let tasks: Vec<_> = ops
            .into_iter()
            .map(|op| {
                let e = engine.clone();
                tokio::task::spawn_local(async move { e.submit(op).await })
            })
            .collect();
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        let c = metrics.op(OpKind::X25519);
        assert_eq!(
            c.batches.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "all eight in one batch"
        );
        assert_eq!(
            c.scalar_computed.load(std::sync::atomic::Ordering::Relaxed),
            0
        );
        // The scalar-made key completed in the batch equals the scalar computation.
        match &results[0] {
            Ok(CryptoOutput::Shared(s)) => {
                assert_eq!(s.to_vec(), aws_shared(&client, &scalar_public))
            }
            other => panic!("{other:?}"),
        }
        for r in &results[1..5] {
            match r {
                Ok(CryptoOutput::PublicAndShared { public, shared }) => {
                    assert_eq!(shared.to_vec(), aws_shared(&client, public))
                }
                other => panic!("{other:?}"),
            }
        }
        // Keys the batch generated complete correctly on the scalar path too.
        for r in results.drain(5..7) {
            match r {
                Ok(CryptoOutput::KeyPair {
                    private_key,
                    public,
                }) => {
                    assert!(matches!(private_key, KxPrivateKey::X25519(_)));
                    let done = scalar::compute(CryptoOp::KxAgree {
                        group: KxGroup::X25519,
                        private_key,
                        peer_public: client_public.clone(),
                    });
                    match done {
                        Ok(CryptoOutput::Shared(s)) => {
                            assert_eq!(s.to_vec(), aws_shared(&client, &public))
                        }
                        other => panic!("{other:?}"),
                    }
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            results.last().unwrap().as_ref().unwrap_err(),
            &CryptoError::BadPeerKey("x25519")
        );
    });
}
