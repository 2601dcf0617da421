//! crypto_mb's batched RSA private operation, checked lane by lane against OpenSSL's raw
//! RSA (`pkeyutl` without padding). Skips loudly on a CPU without AVX-512 IFMA.

mod common;

use std::path::{Path, PathBuf};

use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use common::skip_without_ifma;
use terminus_engine::multibuffer::rsa;
use terminus_engine::HandshakeContext;
use terminus_testkit::{openssl_stdout as openssl, TestDir};

struct Key {
    pem: PathBuf,
    crt: rsa::RsaCrtKey,
}

fn key(dir: &Path, name: &str, bits: usize) -> Key {
    let pem = dir.join(format!("{name}.pem"));
    openssl(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        &format!("rsa_keygen_bits:{bits}"),
        "-out",
        pem.to_str().unwrap(),
    ]);
    let der = openssl(&["pkey", "-in", pem.to_str().unwrap(), "-outform", "DER"]);
    let crt = rsa::RsaCrtKey::from_der(&der).expect("PKCS#8 RSA key accepted");
    // The PKCS#1 form parses to the same key.
    let pkcs1 = openssl(&[
        "rsa",
        "-in",
        pem.to_str().unwrap(),
        "-outform",
        "DER",
        "-traditional",
    ]);
    assert!(rsa::RsaCrtKey::from_der(&pkcs1).is_some());
    Key { pem, crt }
}

fn raw_private(dir: &Path, key: &Key, input: &[u8]) -> Vec<u8> {
    let inp = dir.join("in.bin");
    std::fs::write(&inp, input).unwrap();
    openssl(&[
        "pkeyutl",
        "-decrypt",
        "-inkey",
        key.pem.to_str().unwrap(),
        "-pkeyopt",
        "rsa_padding_mode:none",
        "-in",
        inp.to_str().unwrap(),
    ])
}

fn random_below_modulus(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    SystemRandom::new().fill(&mut v).unwrap();
    v[0] &= 0x3f; // below any modulus with its top bit set
    v
}

#[test]
fn every_lane_count_and_mixed_keys_match_openssl() {
    if skip_without_ifma() {
        return;
    }
    let tmp = TestDir::new("mb-rsa");
    let dir = tmp.root();
    for bits in [2048, 3072, 4096] {
        let keys: Vec<Key> = (0..3)
            .map(|i| key(dir, &format!("k{bits}-{i}"), bits))
            .collect();
        for lanes in 1..=8 {
            let inputs: Vec<Vec<u8>> = (0..lanes).map(|_| random_below_modulus(bits / 8)).collect();
            let batch: Vec<(&rsa::RsaCrtKey, &[u8])> = (0..lanes)
                .map(|i| (&keys[i % keys.len()].crt, inputs[i].as_slice()))
                .collect();
            let results = rsa::private_crt(bits, &batch);
            for (i, r) in results.iter().enumerate() {
                let expected = raw_private(dir, &keys[i % keys.len()], &inputs[i]);
                assert_eq!(
                    r.as_ref().unwrap(),
                    &expected,
                    "{bits} bits, {lanes} lanes, lane {i}"
                );
            }
        }
    }
}

#[test]
fn a_bad_lane_fails_alone() {
    if skip_without_ifma() {
        return;
    }
    let tmp = TestDir::new("mb-rsa-bad");
    let dir = tmp.root();
    let k = key(dir, "k", 2048);
    let good: Vec<Vec<u8>> = (0..8).map(|_| random_below_modulus(256)).collect();
    let too_big = vec![0xffu8; 256]; // not below the modulus
    let short = vec![1u8; 100];
    let mut batch: Vec<(&rsa::RsaCrtKey, &[u8])> =
        good.iter().map(|g| (&k.crt, g.as_slice())).collect();
    batch[3] = (&k.crt, &too_big);
    batch[6] = (&k.crt, &short);
    let results = rsa::private_crt(2048, &batch);
    for (i, r) in results.iter().enumerate() {
        if i == 3 || i == 6 {
            assert_eq!(r, &Err(rsa::LaneError::BadInput), "lane {i}");
        } else {
            assert_eq!(
                r.as_ref().unwrap(),
                &raw_private(dir, &k, &good[i]),
                "lane {i}"
            );
        }
    }
    // A key of another size in the batch fails only its lane.
    let k3 = key(dir, "k3", 3072);
    let in3 = random_below_modulus(384);
    let results = rsa::private_crt(2048, &[(&k.crt, &good[0]), (&k3.crt, &in3)]);
    assert!(results[0].is_ok());
    assert_eq!(results[1], Err(rsa::LaneError::BadInput));
}

#[test]
fn backend_signatures_verify_independently() {
    use std::sync::Arc;

    use aws_lc_rs::signature::{self, UnparsedPublicKey};
    use common::on_multibuffer_engine;
    use rustls::SignatureScheme;
    use terminus_engine::{scalar, CryptoOp, CryptoOutput, OpKind, SigningKeyPair};

    if skip_without_ifma() {
        return;
    }
    let tmp = TestDir::new("mb-rsa-backend");
    let dir = tmp.root();
    let pem = dir.join("k.pem");
    openssl(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        pem.to_str().unwrap(),
    ]);
    let der = openssl(&["pkey", "-in", pem.to_str().unwrap(), "-outform", "DER"]);
    let key = Arc::new(SigningKeyPair::from_der(&der).unwrap());
    assert!(key.rsa_crt().is_some());
    let rsa_pub = openssl(&[
        "rsa",
        "-in",
        pem.to_str().unwrap(),
        "-RSAPublicKey_out",
        "-outform",
        "DER",
    ]);

    let schemes = [
        SignatureScheme::RSA_PSS_SHA256,
        SignatureScheme::RSA_PSS_SHA384,
        SignatureScheme::RSA_PSS_SHA512,
        SignatureScheme::RSA_PKCS1_SHA256,
        SignatureScheme::RSA_PKCS1_SHA384,
        SignatureScheme::RSA_PKCS1_SHA512,
        SignatureScheme::RSA_PSS_SHA256,
        SignatureScheme::RSA_PKCS1_SHA256,
    ];
    on_multibuffer_engine(Arc::default(), |engine, metrics| async move {
        let _guards: Vec<_> = (0..9).map(|_| engine.handshake_started()).collect();
        let tasks: Vec<_> = schemes
            .iter()
            .enumerate()
            .map(|(i, &scheme)| {
                let (e, key) = (engine.clone(), key.clone());
                let message = format!("transcript {i}").into_bytes();
                tokio::task::spawn_local(async move {
                    (
                        scheme,
                        message.clone(),
                        e.submit(
                            CryptoOp::Sign {
                                key,
                                scheme,
                                message,
                            },
                            &HandshakeContext::starting_now(),
                        )
                        .await,
                    )
                })
            })
            .collect();
        for t in tasks {
            let (scheme, message, result) = t.await.unwrap();
            let Ok(CryptoOutput::Signature(sig)) = result else {
                panic!("{scheme:?}: {result:?}")
            };
            let alg: &dyn signature::VerificationAlgorithm = match scheme {
                SignatureScheme::RSA_PSS_SHA256 => &signature::RSA_PSS_2048_8192_SHA256,
                SignatureScheme::RSA_PSS_SHA384 => &signature::RSA_PSS_2048_8192_SHA384,
                SignatureScheme::RSA_PSS_SHA512 => &signature::RSA_PSS_2048_8192_SHA512,
                SignatureScheme::RSA_PKCS1_SHA256 => &signature::RSA_PKCS1_2048_8192_SHA256,
                SignatureScheme::RSA_PKCS1_SHA384 => &signature::RSA_PKCS1_2048_8192_SHA384,
                _ => &signature::RSA_PKCS1_2048_8192_SHA512,
            };
            UnparsedPublicKey::new(alg, &rsa_pub)
                .verify(&message, &sig)
                .unwrap_or_else(|_| panic!("{scheme:?} does not verify"));
            if matches!(
                scheme,
                SignatureScheme::RSA_PKCS1_SHA256
                    | SignatureScheme::RSA_PKCS1_SHA384
                    | SignatureScheme::RSA_PKCS1_SHA512
            ) {
                let reference = scalar::compute(CryptoOp::Sign {
                    key: key.clone(),
                    scheme,
                    message,
                })
                .unwrap();
                let CryptoOutput::Signature(reference) = reference else {
                    panic!()
                };
                assert_eq!(sig, reference, "{scheme:?} byte-equal to aws-lc");
            }
        }
        assert_eq!(metrics.batches(OpKind::RsaSign), 1, "one batch of eight");
        assert_eq!(
            metrics.scalar_computed(OpKind::RsaSign),
            0,
            "all in the mb8 call"
        );
    });
}
