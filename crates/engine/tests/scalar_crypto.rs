//! The scalar backend's results checked against an independent implementation: the
//! OpenSSL command line.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use rustls::SignatureScheme;
use terminus_engine::{scalar, CryptoError, CryptoOp, CryptoOutput, KxGroup, SigningKeyPair};
use terminus_testkit::{openssl_stdout as openssl, TestDir};

fn keygen(dir: &Path, name: &str, args: &[&str]) -> (PathBuf, Arc<SigningKeyPair>) {
    let pem = dir.join(format!("{name}.pem"));
    let mut full = vec!["genpkey"];
    full.extend_from_slice(args);
    full.extend_from_slice(&["-out", pem.to_str().unwrap()]);
    openssl(&full);
    let der = dir.join(format!("{name}.der"));
    openssl(&[
        "pkey",
        "-in",
        pem.to_str().unwrap(),
        "-outform",
        "DER",
        "-out",
        der.to_str().unwrap(),
    ]);
    let key = SigningKeyPair::from_der(&std::fs::read(&der).unwrap()).unwrap();
    (pem, Arc::new(key))
}

fn sign(key: &Arc<SigningKeyPair>, scheme: SignatureScheme, message: &[u8]) -> Vec<u8> {
    match scalar::compute(CryptoOp::Sign {
        key: key.clone(),
        scheme,
        message: message.to_vec(),
    }) {
        Ok(CryptoOutput::Signature(s)) => s,
        other => panic!("{other:?}"),
    }
}

fn openssl_verify(
    dir: &Path,
    key_pem: &Path,
    digest: &str,
    extra: &[&str],
    message: &[u8],
    sig: &[u8],
) -> bool {
    let msg = dir.join("msg.bin");
    let sig_path = dir.join("sig.bin");
    let pubkey = dir.join("pub.pem");
    std::fs::write(&msg, message).unwrap();
    std::fs::write(&sig_path, sig).unwrap();
    openssl(&[
        "pkey",
        "-in",
        key_pem.to_str().unwrap(),
        "-pubout",
        "-out",
        pubkey.to_str().unwrap(),
    ]);
    let mut args = vec![
        "dgst",
        digest,
        "-verify",
        pubkey.to_str().unwrap(),
        "-signature",
        sig_path.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    args.push(msg.to_str().unwrap());
    Command::new("openssl")
        .args(&args)
        .output()
        .unwrap()
        .status
        .success()
}

#[test]
fn rsa_signatures_match_openssl() {
    let dir = TestDir::new("rsa");
    for bits in [2048, 3072, 4096] {
        let (pem, key) = keygen(
            &dir.0,
            &format!("rsa{bits}"),
            &[
                "-algorithm",
                "RSA",
                "-pkeyopt",
                &format!("rsa_keygen_bits:{bits}"),
            ],
        );
        let message = format!("TLS handshake transcript for {bits}-bit key").into_bytes();
        for (scheme, digest) in [
            (SignatureScheme::RSA_PKCS1_SHA256, "-sha256"),
            (SignatureScheme::RSA_PKCS1_SHA384, "-sha384"),
            (SignatureScheme::RSA_PKCS1_SHA512, "-sha512"),
        ] {
            let ours = sign(&key, scheme, &message);
            // PKCS#1 v1.5 is deterministic: byte-equal to OpenSSL's.
            let msg = dir.0.join("m.bin");
            std::fs::write(&msg, &message).unwrap();
            let theirs = openssl(&[
                "dgst",
                digest,
                "-sign",
                pem.to_str().unwrap(),
                msg.to_str().unwrap(),
            ]);
            assert_eq!(ours, theirs, "{bits} {scheme:?}");
        }
        for (scheme, digest) in [
            (SignatureScheme::RSA_PSS_SHA256, "-sha256"),
            (SignatureScheme::RSA_PSS_SHA384, "-sha384"),
            (SignatureScheme::RSA_PSS_SHA512, "-sha512"),
        ] {
            let a = sign(&key, scheme, &message);
            let b = sign(&key, scheme, &message);
            assert_ne!(a, b, "PSS salts are random");
            let pss = [
                "-sigopt",
                "rsa_padding_mode:pss",
                "-sigopt",
                "rsa_pss_saltlen:digest",
            ];
            assert!(
                openssl_verify(&dir.0, &pem, digest, &pss, &message, &a),
                "{bits} {scheme:?}"
            );
            assert!(!openssl_verify(
                &dir.0,
                &pem,
                digest,
                &pss,
                b"another message",
                &a
            ));
        }
    }
}

#[test]
fn ecdsa_signatures_verify_with_openssl_and_never_repeat() {
    let dir = TestDir::new("ecdsa");
    for (curve, scheme, digest) in [
        ("P-256", SignatureScheme::ECDSA_NISTP256_SHA256, "-sha256"),
        ("P-384", SignatureScheme::ECDSA_NISTP384_SHA384, "-sha384"),
    ] {
        let (pem, key) = keygen(
            &dir.0,
            curve,
            &[
                "-algorithm",
                "EC",
                "-pkeyopt",
                &format!("ec_paramgen_curve:{curve}"),
            ],
        );
        let message = b"same message every time";
        let sigs: Vec<Vec<u8>> = (0..50).map(|_| sign(&key, scheme, message)).collect();
        let mut unique = sigs.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(
            unique.len(),
            sigs.len(),
            "{curve}: a fresh nonce per signature"
        );
        for s in sigs.iter().take(3) {
            assert!(
                openssl_verify(&dir.0, &pem, digest, &[], message, s),
                "{curve}"
            );
        }
        // A scheme that does not fit the key is refused, not silently changed.
        let wrong = scalar::compute(CryptoOp::Sign {
            key: key.clone(),
            scheme: SignatureScheme::RSA_PSS_SHA256,
            message: message.to_vec(),
        });
        assert!(matches!(wrong, Err(CryptoError::SchemeMismatch(_))));
    }
}

fn generate(group: KxGroup) -> (terminus_engine::KxPrivateKey, Vec<u8>) {
    match scalar::compute(CryptoOp::KxGenerate { group }) {
        Ok(CryptoOutput::KeyPair {
            private_key,
            public,
        }) => (private_key, public),
        other => panic!("{other:?}"),
    }
}

#[test]
fn key_exchange_both_sides_agree() {
    for group in KxGroup::CLASSICAL {
        for _ in 0..20 {
            let (a_priv, a_pub) = generate(group);
            let (b_priv, b_pub) = generate(group);
            let ab = scalar::compute(CryptoOp::KxAgree {
                group,
                private_key: a_priv,
                peer_public: b_pub.clone(),
            });
            let ba = scalar::compute(CryptoOp::KxAgree {
                group,
                private_key: b_priv,
                peer_public: a_pub,
            });
            match (ab, ba) {
                (Ok(CryptoOutput::Shared(x)), Ok(CryptoOutput::Shared(y))) => {
                    assert_eq!(*x, *y, "{group:?}")
                }
                other => panic!("{group:?}: {other:?}"),
            }
            match scalar::compute(CryptoOp::KxGenerateAgree {
                group,
                peer_public: b_pub,
            }) {
                Ok(CryptoOutput::PublicAndShared { public, shared }) => {
                    assert!(!public.is_empty() && !shared.is_empty())
                }
                other => panic!("{other:?}"),
            }
        }
        // An invalid peer share fails that exchange only.
        let (p, _) = generate(group);
        let bad = scalar::compute(CryptoOp::KxAgree {
            group,
            private_key: p,
            peer_public: vec![0x04; 7],
        });
        assert!(matches!(bad, Err(CryptoError::BadPeerKey(_))), "{group:?}");
    }
}

/// NIST-curve shares in the compressed (0x02/0x03) and hybrid (0x06/0x07) forms X9.62
/// also defines are refused: TLS allows only the uncompressed one, and aws-lc alone would
/// take them (the multibuffer path refuses them too: multibuffer_kx.rs).
#[test]
fn nist_shares_must_be_uncompressed_points() {
    for group in [KxGroup::Secp256r1, KxGroup::Secp384r1] {
        let (_, good) = generate(group);
        let len = (good.len() - 1) / 2;
        let y_odd = good[2 * len] & 1;
        let mut compressed = vec![0x02 | y_odd];
        compressed.extend_from_slice(&good[1..=len]);
        let mut hybrid = good.clone();
        hybrid[0] = 0x06 | y_odd;
        for (form, share) in [("compressed", compressed), ("hybrid", hybrid)] {
            let (private_key, _) = generate(group);
            let result = scalar::compute(CryptoOp::KxAgree {
                group,
                private_key,
                peer_public: share,
            });
            assert!(
                matches!(result, Err(CryptoError::BadPeerKey(_))),
                "{group:?} {form}: {result:?}"
            );
        }
        let (private_key, _) = generate(group);
        let ok = scalar::compute(CryptoOp::KxAgree {
            group,
            private_key,
            peer_public: good,
        });
        assert!(ok.is_ok(), "{group:?} uncompressed");
    }
}

#[test]
fn x25519_matches_openssl() {
    let dir = TestDir::new("x25519");
    let theirs = dir.0.join("peer.pem");
    openssl(&[
        "genpkey",
        "-algorithm",
        "X25519",
        "-out",
        theirs.to_str().unwrap(),
    ]);
    let der = openssl(&[
        "pkey",
        "-in",
        theirs.to_str().unwrap(),
        "-pubout",
        "-outform",
        "DER",
    ]);
    let their_pub = der[der.len() - 32..].to_vec();
    let (ours, our_pub) = generate(KxGroup::X25519);
    let shared = match scalar::compute(CryptoOp::KxAgree {
        group: KxGroup::X25519,
        private_key: ours,
        peer_public: their_pub,
    }) {
        Ok(CryptoOutput::Shared(s)) => s,
        other => panic!("{other:?}"),
    };
    // Our public key as an X25519 SubjectPublicKeyInfo, for OpenSSL's derive.
    let mut spki = vec![
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x6e, 0x03, 0x21, 0x00,
    ];
    spki.extend_from_slice(&our_pub);
    let our_pub_der = dir.0.join("ours.der");
    std::fs::write(&our_pub_der, &spki).unwrap();
    let their_shared = openssl(&[
        "pkeyutl",
        "-derive",
        "-inkey",
        theirs.to_str().unwrap(),
        "-peerkey",
        our_pub_der.to_str().unwrap(),
        "-peerform",
        "DER",
    ]);
    assert_eq!(*shared, their_shared);
}
