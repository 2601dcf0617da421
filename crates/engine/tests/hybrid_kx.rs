//! X25519MLKEM768 through the engine, checked against rustls's own hybrid on aws-lc (an
//! independent implementation of draft-ietf-tls-ecdhe-mlkem's layout): on the scalar
//! path, and where crypto_mb runs in multibuffer batches, as a server and as a client;
//! malformed shares refused.

mod common;

use std::sync::Arc;

use common::{on_multibuffer_engine, skip_without_ifma};
use rustls::crypto::aws_lc_rs::kx_group::{X25519, X25519MLKEM768 as RUSTLS_HYBRID};
use rustls::crypto::ActiveKeyExchange;
use terminus_engine::cost::{Crossovers, Operation};
use terminus_engine::{
    scalar, CryptoError, CryptoOp, CryptoOutput, HandshakeContext, KxGroup, KxPrivateKey, OpKind,
};

const GROUP: KxGroup = KxGroup::X25519MlKem768;

/// A client's hybrid share (ML-KEM-768 encapsulation key, then X25519) is 1184 + 32 bytes,
/// a server's (ciphertext, then X25519) 1088 + 32.
const CLIENT_SHARE: usize = 1216;
const SERVER_SHARE: usize = 1120;

/// The engine answered a server's generate-and-agree: rustls's client, which sent the
/// share, derives the same secret from the engine's share.
fn check_as_server(client: Box<dyn ActiveKeyExchange>, result: Result<CryptoOutput, CryptoError>) {
    let Ok(CryptoOutput::PublicAndShared { public, shared }) = result else {
        panic!("{result:?}")
    };
    assert_eq!(public.len(), SERVER_SHARE);
    assert_eq!(shared.len(), 64, "ML-KEM's 32 bytes, then X25519's");
    let theirs = client
        .complete(&public)
        .expect("rustls accepts the engine's share");
    assert_eq!(theirs.secret_bytes(), &shared[..]);
}

/// The engine generated a client's share: rustls's server completes against it, and the
/// engine's agreement with the server's share gives the server's secret.
fn check_as_client(
    generated: Result<CryptoOutput, CryptoError>,
    agree: impl FnOnce(CryptoOp) -> Result<CryptoOutput, CryptoError>,
) {
    let Ok(CryptoOutput::KeyPair {
        private_key,
        public,
    }) = generated
    else {
        panic!("{generated:?}")
    };
    assert_eq!(public.len(), CLIENT_SHARE);
    let server = RUSTLS_HYBRID
        .start_and_complete(&public)
        .expect("rustls accepts the engine's share");
    let ours = agree(CryptoOp::KxAgree {
        group: GROUP,
        private_key,
        peer_public: server.pub_key.clone(),
    });
    assert_eq!(shared(ours), server.secret.secret_bytes());
}

/// The secret of a completed exchange.
fn shared(result: Result<CryptoOutput, CryptoError>) -> Vec<u8> {
    match result {
        Ok(CryptoOutput::Shared(secret)) => secret.to_vec(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn scalar_hybrid_agrees_with_rustls_as_server_and_client() {
    for _ in 0..20 {
        let client = RUSTLS_HYBRID.start().unwrap();
        let result = scalar::compute(CryptoOp::KxGenerateAgree {
            group: GROUP,
            peer_public: client.pub_key().to_vec(),
        });
        check_as_server(client, result);
        check_as_client(
            scalar::compute(CryptoOp::KxGenerate { group: GROUP }),
            scalar::compute,
        );
    }
}

/// A client that offered the hybrid's X25519 half as a share of its own completes it with
/// the classical half of its hybrid key, when the server chose plain X25519.
#[test]
fn the_classical_half_of_a_hybrid_key_completes_plain_x25519() {
    let Ok(CryptoOutput::KeyPair {
        private_key,
        public,
    }) = scalar::compute(CryptoOp::KxGenerate { group: GROUP })
    else {
        panic!()
    };
    let server = X25519
        .start_and_complete(&public[CLIENT_SHARE - 32..])
        .unwrap();
    let ours = scalar::compute(CryptoOp::KxAgree {
        group: KxGroup::X25519,
        private_key: private_key.into_classical(),
        peer_public: server.pub_key.clone(),
    });
    assert_eq!(shared(ours), server.secret.secret_bytes());
}

#[test]
fn malformed_hybrid_shares_are_the_peers_error() {
    let good = RUSTLS_HYBRID.start().unwrap().pub_key().to_vec();
    let mut low_order_x25519 = good.clone();
    low_order_x25519[CLIENT_SHARE - 32..].fill(0);
    // ML-KEM encapsulation keys hold 12-bit coefficients below q = 3329; all-ones bytes
    // are 4095s, which FIPS 203's modulus check refuses.
    let mut coefficients_above_q = good.clone();
    coefficients_above_q[..1152].fill(0xff);
    for (why, share) in [
        ("a byte short", good[1..].to_vec()),
        ("a plain X25519 share", good[CLIENT_SHARE - 32..].to_vec()),
        ("X25519 half of low order", low_order_x25519),
        ("ML-KEM key not reduced mod q", coefficients_above_q),
    ] {
        let result = scalar::compute(CryptoOp::KxGenerateAgree {
            group: GROUP,
            peer_public: share,
        });
        assert!(
            matches!(
                result,
                Err(CryptoError::BadPeerKey("x25519mlkem768" | "x25519"))
            ),
            "{why}: {result:?}"
        );
    }
    // A client's completion: the server's share has the ciphertext's length or is refused,
    // and a classical key cannot complete a hybrid exchange.
    let Ok(CryptoOutput::KeyPair { private_key, .. }) =
        scalar::compute(CryptoOp::KxGenerate { group: GROUP })
    else {
        panic!()
    };
    let short = scalar::compute(CryptoOp::KxAgree {
        group: GROUP,
        private_key,
        peer_public: vec![7; SERVER_SHARE - 1],
    });
    assert_eq!(
        short.unwrap_err(),
        CryptoError::BadPeerKey("x25519mlkem768")
    );
    let Ok(CryptoOutput::KeyPair { private_key, .. }) = scalar::compute(CryptoOp::KxGenerate {
        group: KxGroup::X25519,
    }) else {
        panic!()
    };
    let mismatch = scalar::compute(CryptoOp::KxAgree {
        group: GROUP,
        private_key,
        peer_public: vec![7; SERVER_SHARE],
    });
    assert_eq!(
        mismatch.unwrap_err(),
        CryptoError::KeyMismatch("x25519mlkem768")
    );
}

/// Hybrids through the multibuffer backend under the engine, batches of every size the
/// crossover lets through: servers' exchanges, clients' key pairs (completed by the
/// batched path too) and a malformed share, each answered with its own result, in one
/// batch of the hybrid's own queue with no lane computed scalar.
#[test]
fn multibuffer_batches_of_hybrids_agree_with_rustls() {
    if skip_without_ifma() {
        return;
    }
    for lanes in [1, 3, 8] {
        let crossovers = Arc::new(Crossovers::default());
        crossovers.set(Operation::X25519, 1);
        on_multibuffer_engine(crossovers, |engine, metrics| async move {
            let _guards: Vec<_> = (0..lanes).map(|_| engine.handshake_started()).collect();
            let submit = |op: CryptoOp| {
                let e = engine.clone();
                tokio::task::spawn_local(async move {
                    e.submit(op, &HandshakeContext::starting_now()).await
                })
            };
            let clients: Vec<_> = (0..lanes.min(5))
                .map(|_| RUSTLS_HYBRID.start().unwrap())
                .collect();
            let mut tasks: Vec<_> = clients
                .iter()
                .map(|c| {
                    submit(CryptoOp::KxGenerateAgree {
                        group: GROUP,
                        peer_public: c.pub_key().to_vec(),
                    })
                })
                .collect();
            let generating = (lanes - clients.len()).min(2);
            tasks.extend((0..generating).map(|_| submit(CryptoOp::KxGenerate { group: GROUP })));
            let bad = lanes - clients.len() - generating;
            tasks.extend((0..bad).map(|_| {
                submit(CryptoOp::KxGenerateAgree {
                    group: GROUP,
                    // ML-KEM coefficients of 4095, above q.
                    peer_public: vec![0xff; CLIENT_SHARE],
                })
            }));
            let mut results = Vec::new();
            for t in tasks {
                results.push(t.await.unwrap());
            }
            let kind = OpKind::X25519MlKem768;
            assert_eq!(metrics.batches(kind), 1, "{lanes} lanes in one batch");
            assert_eq!(metrics.scalar_computed(kind), 0);
            assert_eq!(metrics.requests(OpKind::X25519), 0, "counted as hybrids");
            let mut results = results.into_iter();
            for client in clients {
                check_as_server(client, results.next().unwrap());
            }
            let mut pairs = Vec::new();
            for _ in 0..generating {
                pairs.push(results.next().unwrap());
            }
            for r in results {
                assert!(matches!(r, Err(CryptoError::BadPeerKey(_))), "{r:?}");
            }
            // The clients' completions, batched together.
            let mut agreed = Vec::new();
            let mut expected = Vec::new();
            for generated in pairs {
                let Ok(CryptoOutput::KeyPair {
                    private_key,
                    public,
                }) = generated
                else {
                    panic!("{generated:?}")
                };
                assert!(matches!(private_key, KxPrivateKey::Hybrid(_)));
                let server = RUSTLS_HYBRID.start_and_complete(&public).unwrap();
                expected.push(server.secret.secret_bytes().to_vec());
                agreed.push(submit(CryptoOp::KxAgree {
                    group: GROUP,
                    private_key,
                    peer_public: server.pub_key,
                }));
            }
            for (t, want) in agreed.into_iter().zip(expected) {
                assert_eq!(shared(t.await.unwrap()), want);
            }
        });
    }
}
