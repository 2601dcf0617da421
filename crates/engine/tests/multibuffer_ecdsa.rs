//! crypto_mb's batched ECDSA P-256 and P-384 signatures verified by aws-lc-rs. Skips loudly on a
//! CPU without AVX-512 IFMA.

mod common;

use aws_lc_rs::signature::{
    EcdsaVerificationAlgorithm, UnparsedPublicKey, ECDSA_P256_SHA256_ASN1, ECDSA_P384_SHA384_ASN1,
};
use common::skip_without_ifma;
use terminus_engine::multibuffer::ecdsa::{self, EcKey};
use terminus_engine::multibuffer::nist::Curve;
use terminus_testkit::{openssl_stdout as openssl, TestDir};

const CURVES: [Curve; 2] = [Curve::P256, Curve::P384];

fn verifier(curve: Curve) -> &'static EcdsaVerificationAlgorithm {
    match curve {
        Curve::P256 => &ECDSA_P256_SHA256_ASN1,
        Curve::P384 => &ECDSA_P384_SHA384_ASN1,
    }
}

/// (key in the batched form, uncompressed public point); alternately parsed from PKCS#8
/// and from SEC1 DER.
fn keys(curve: Curve, n: usize) -> Vec<(EcKey, Vec<u8>)> {
    let tmp = TestDir::new("mb-ecdsa");
    let dir = tmp.root();
    let out = (0..n)
        .map(|i| {
            let pem = dir.join(format!("k{i}.pem"));
            openssl(&[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                &format!("ec_paramgen_curve:{}", curve.name()),
                "-out",
                pem.to_str().unwrap(),
            ]);
            let der = if i % 2 == 0 {
                openssl(&["pkey", "-in", pem.to_str().unwrap(), "-outform", "DER"])
            } else {
                openssl(&["ec", "-in", pem.to_str().unwrap(), "-outform", "DER"])
            };
            let spki = openssl(&[
                "pkey",
                "-in",
                pem.to_str().unwrap(),
                "-pubout",
                "-outform",
                "DER",
            ]);
            (
                EcKey::from_der(curve, &der).expect("EC key parses"),
                spki[spki.len() - (1 + 2 * curve.byte_len())..].to_vec(),
            )
        })
        .collect();
    out
}

#[test]
fn signatures_verify_for_every_lane_count_and_mixed_keys() {
    if skip_without_ifma() {
        return;
    }
    for curve in CURVES {
        signatures_verify(curve);
    }
}

fn signatures_verify(curve: Curve) {
    let keys = keys(curve, 3);
    for round in 0..30 {
        for lanes in 1..=8 {
            let messages: Vec<Vec<u8>> = (0..lanes)
                .map(|i| format!("round {round} lane {i}").into_bytes())
                .collect();
            let batch: Vec<(&EcKey, &[u8])> = (0..lanes)
                .map(|i| (&keys[i % 3].0, messages[i].as_slice()))
                .collect();
            for (i, sig) in ecdsa::sign(&batch).into_iter().enumerate() {
                let sig = sig.unwrap();
                UnparsedPublicKey::new(verifier(curve), &keys[i % 3].1)
                    .verify(&messages[i], &sig)
                    .unwrap_or_else(|_| {
                        panic!("{curve:?} {lanes} lanes, lane {i}: signature does not verify")
                    });
                assert!(UnparsedPublicKey::new(verifier(curve), &keys[i % 3].1)
                    .verify(b"other", &sig)
                    .is_err());
            }
        }
    }
}

#[test]
fn nonces_are_fresh_for_every_signature() {
    if skip_without_ifma() {
        return;
    }
    for curve in CURVES {
        nonces_are_fresh(curve);
    }
}

fn nonces_are_fresh(curve: Curve) {
    let keys = keys(curve, 1);
    let message = b"the same message in every lane";
    let mut all = Vec::new();
    for _ in 0..8 {
        let batch: Vec<(&EcKey, &[u8])> =
            (0..8).map(|_| (&keys[0].0, message.as_slice())).collect();
        all.extend(ecdsa::sign(&batch).into_iter().map(Result::unwrap));
    }
    let mut unique = all.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        64,
        "{curve:?}: 64 signatures of one message, all different"
    );
}

#[test]
fn a_key_on_the_other_curve_is_refused() {
    let tmp = TestDir::new("mb-ecdsa-wrong-curve");
    let pem = tmp.root().join("k.pem");
    openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-384",
        "-out",
        pem.to_str().unwrap(),
    ]);
    let der = openssl(&["pkey", "-in", pem.to_str().unwrap(), "-outform", "DER"]);
    assert!(EcKey::from_der(Curve::P256, &der).is_none());
    assert!(EcKey::from_der(Curve::P384, &der).is_some());
}
