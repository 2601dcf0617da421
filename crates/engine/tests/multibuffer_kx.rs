//! crypto_mb's batched key exchanges (X25519, ECDH P-256 and P-384) against aws-lc-rs,
//! and the multibuffer backend's handling of mixed key-exchange requests. Skips loudly on
//! a CPU without AVX-512 IFMA.

mod common;

use std::sync::Arc;

use aws_lc_rs::agreement::{self, UnparsedPublicKey};
use aws_lc_rs::rand::SystemRandom;
use common::{on_multibuffer_engine, skip_without_ifma};
use terminus_engine::multibuffer::kx;
use terminus_engine::{
    scalar, CryptoError, CryptoOp, CryptoOutput, HandshakeContext, KxGroup, KxPrivateKey,
};

fn random_private(group: KxGroup) -> Vec<u8> {
    kx::random_private(group, &SystemRandom::new())
        .expect("CSPRNG")
        .to_vec()
}

fn aws_key(group: KxGroup, private: &[u8]) -> agreement::PrivateKey {
    agreement::PrivateKey::from_private_key(group.algorithm(), private).unwrap()
}

fn aws_public(group: KxGroup, private: &[u8]) -> Vec<u8> {
    aws_key(group, private)
        .compute_public_key()
        .unwrap()
        .as_ref()
        .to_vec()
}

fn aws_shared(group: KxGroup, private: &[u8], peer: &[u8]) -> Vec<u8> {
    agreement::agree(
        &aws_key(group, private),
        UnparsedPublicKey::new(group.algorithm(), peer),
        (),
        |s| Ok(s.to_vec()),
    )
    .unwrap()
}

/// `n` fresh private keys of `group`, and `n` fresh peers' public keys.
fn keys_and_peers(group: KxGroup, n: usize) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let privs = (0..n).map(|_| random_private(group)).collect();
    let peers = (0..n)
        .map(|_| aws_public(group, &random_private(group)))
        .collect();
    (privs, peers)
}

/// (private key, peer public key) lanes as the kernels take them.
fn pairs<'a>(privs: &'a [Vec<u8>], peers: &'a [Vec<u8>]) -> Vec<(&'a [u8], &'a [u8])> {
    privs
        .iter()
        .zip(peers)
        .map(|(k, p)| (k.as_slice(), p.as_slice()))
        .collect()
}

#[test]
fn public_keys_and_secrets_match_aws_lc_for_every_lane_count() {
    if skip_without_ifma() {
        return;
    }
    for group in KxGroup::CLASSICAL {
        let rounds = if group == KxGroup::Secp384r1 { 20 } else { 50 };
        for _round in 0..rounds {
            for lanes in 1..=8 {
                let (privs, peers) = keys_and_peers(group, lanes);
                let refs: Vec<&[u8]> = privs.iter().map(Vec::as_slice).collect();
                let publics = kx::public_keys(group, &refs);
                let secrets = kx::shared_secrets(group, &pairs(&privs, &peers));
                for i in 0..lanes {
                    assert_eq!(
                        publics[i].as_ref().unwrap(),
                        &aws_public(group, &privs[i]),
                        "{group:?}, {lanes} lanes, lane {i}"
                    );
                    assert_eq!(
                        secrets[i].as_ref().unwrap().to_vec(),
                        aws_shared(group, &privs[i], &peers[i]),
                        "{group:?}, {lanes} lanes, lane {i}"
                    );
                }
            }
        }
    }
}

/// Peer keys each group must refuse, and why.
fn bad_peers(group: KxGroup) -> Vec<(&'static str, Vec<u8>)> {
    match group {
        KxGroup::X25519 => vec![
            ("the identity (all-zero secret)", vec![0u8; 32]),
            ("wrong length", vec![9u8; 31]),
        ],
        _ => {
            let good = aws_public(group, &random_private(group));
            let len = (good.len() - 1) / 2;
            let mut off_curve = good.clone();
            *off_curve.last_mut().unwrap() ^= 1;
            let mut x_too_big = good.clone();
            x_too_big[1..1 + len].fill(0xff);
            let mut compressed = good[..1 + len].to_vec();
            compressed[0] = 0x02;
            vec![
                ("off the curve", off_curve),
                ("x >= p", x_too_big),
                ("compressed encoding", compressed),
                ("point at infinity", vec![0x00]),
                ("empty", vec![]),
            ]
        }
    }
}

#[test]
fn a_bad_peer_key_fails_its_lane_only() {
    if skip_without_ifma() {
        return;
    }
    for group in KxGroup::CLASSICAL {
        for (why, bad) in bad_peers(group) {
            let (privs, mut peers) = keys_and_peers(group, 8);
            peers[2] = bad.clone();
            peers[5] = bad;
            let secrets = kx::shared_secrets(group, &pairs(&privs, &peers));
            for (i, s) in secrets.iter().enumerate() {
                match i {
                    2 | 5 => assert!(s.is_err(), "{group:?} {why}: lane {i} must fail"),
                    _ => assert_eq!(
                        s.as_ref().unwrap().to_vec(),
                        aws_shared(group, &privs[i], &peers[i]),
                        "{group:?} {why}: lane {i}"
                    ),
                }
            }
        }
    }
}

#[test]
fn an_out_of_range_private_scalar_fails_its_lane_only() {
    if skip_without_ifma() {
        return;
    }
    for group in [KxGroup::Secp256r1, KxGroup::Secp384r1] {
        let mut privs: Vec<Vec<u8>> = (0..8).map(|_| random_private(group)).collect();
        privs[3].fill(0xff); // above the group order
        privs[6].fill(0); // zero
        let refs: Vec<&[u8]> = privs.iter().map(Vec::as_slice).collect();
        for (i, public) in kx::public_keys(group, &refs).iter().enumerate() {
            match i {
                3 | 6 => assert!(public.is_err(), "{group:?} lane {i} must fail"),
                _ => assert_eq!(public.as_ref().unwrap(), &aws_public(group, &privs[i])),
            }
        }
    }
}

#[test]
fn backend_batches_mixed_exchanges_and_agrees_with_the_scalar_path() {
    if skip_without_ifma() {
        return;
    }
    for group in KxGroup::CLASSICAL {
        mixed_batch(group);
    }
}

fn mixed_batch(group: KxGroup) {
    on_multibuffer_engine(Arc::default(), |engine, metrics| async move {
        // A scalar-made key pair, to be completed by the batched path.
        let (scalar_private, scalar_public) =
            match scalar::compute(CryptoOp::KxGenerate { group }).unwrap() {
                CryptoOutput::KeyPair {
                    private_key,
                    public,
                } => (private_key, public),
                other => panic!("{other:?}"),
            };
        assert!(matches!(scalar_private, KxPrivateKey::AwsLc(_)));
        let client = random_private(group);
        let client_public = aws_public(group, &client);
        let _guards: Vec<_> = (0..8).map(|_| engine.handshake_started()).collect();
        let mut ops = vec![CryptoOp::KxAgree {
            group,
            private_key: scalar_private,
            peer_public: client_public.clone(),
        }];
        ops.extend((0..4).map(|_| CryptoOp::KxGenerateAgree {
            group,
            peer_public: client_public.clone(),
        }));
        ops.extend((0..2).map(|_| CryptoOp::KxGenerate { group }));
        ops.push(CryptoOp::KxGenerateAgree {
            group,
            peer_public: bad_peers(group).remove(0).1,
        });
        let tasks: Vec<_> = ops
            .into_iter()
            .map(|op| {
                let e = engine.clone();
                tokio::task::spawn_local(async move {
                    e.submit(op, &HandshakeContext::starting_now()).await
                })
            })
            .collect();
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        let kind = group.op_kind();
        assert_eq!(
            metrics.batches(kind),
            1,
            "{group:?}: all eight in one batch"
        );
        assert_eq!(metrics.scalar_computed(kind), 0, "{group:?}");
        // The scalar-made key completed in the batch equals the scalar computation.
        match &results[0] {
            Ok(CryptoOutput::Shared(s)) => {
                assert_eq!(s.to_vec(), aws_shared(group, &client, &scalar_public))
            }
            other => panic!("{other:?}"),
        }
        for r in &results[1..5] {
            match r {
                Ok(CryptoOutput::PublicAndShared { public, shared }) => {
                    assert_eq!(shared.to_vec(), aws_shared(group, &client, public))
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
                    assert!(matches!(private_key, KxPrivateKey::Raw(_)));
                    let done = scalar::compute(CryptoOp::KxAgree {
                        group,
                        private_key,
                        peer_public: client_public.clone(),
                    });
                    match done {
                        Ok(CryptoOutput::Shared(s)) => {
                            assert_eq!(s.to_vec(), aws_shared(group, &client, &public))
                        }
                        other => panic!("{other:?}"),
                    }
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            results.last().unwrap().as_ref().unwrap_err(),
            &CryptoError::BadPeerKey(group.name())
        );
    });
}
