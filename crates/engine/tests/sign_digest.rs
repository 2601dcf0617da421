//! Signatures of digests (a keyless signer's requests): on the scalar path and in
//! crypto_mb's batches, every RSA scheme and ECDSA curve, each signature verified by
//! aws-lc-rs against the *message* the digest was made of (the independent check), and
//! a digest of the wrong length or hash refused, never signed. The crypto_mb half skips
//! loudly on a CPU without AVX-512 IFMA.

mod common;

use std::sync::Arc;

use aws_lc_rs::digest;
use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rsa::KeySize;
use aws_lc_rs::signature::{self, EcdsaKeyPair, KeyPair, RsaKeyPair, UnparsedPublicKey};
use common::{on_multibuffer_engine, skip_without_ifma};
use rustls::SignatureScheme;
use terminus_engine::{
    scalar, scheme_digest, CryptoError, CryptoOp, CryptoOutput, HandshakeContext, OpKind,
    SigningKeyPair,
};

/// A key, its public key as aws-lc verifies with it, and the schemes it signs.
struct Key {
    pair: Arc<SigningKeyPair>,
    public: Vec<u8>,
    schemes: &'static [SignatureScheme],
}

fn keys() -> Vec<Key> {
    let rsa = RsaKeyPair::generate(KeySize::Rsa2048).unwrap();
    let rsa_der = AsDer::<aws_lc_rs::encoding::Pkcs8V1Der>::as_der(&rsa).unwrap();
    let mut keys = vec![(
        rsa_der.as_ref().to_vec(),
        rsa.public_key().as_ref().to_vec(),
    )];
    for alg in [
        &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        &signature::ECDSA_P384_SHA384_ASN1_SIGNING,
    ] {
        let ec = EcdsaKeyPair::generate(alg).unwrap();
        keys.push((
            ec.to_pkcs8v1().unwrap().as_ref().to_vec(),
            ec.public_key().as_ref().to_vec(),
        ));
    }
    keys.into_iter()
        .map(|(der, public)| {
            let pair = Arc::new(SigningKeyPair::from_der(&der).unwrap());
            // Every scheme terminus offers for the key: what a terminator may ask.
            let schemes = pair.algorithm().schemes();
            Key {
                pair,
                public,
                schemes,
            }
        })
        .collect()
}

fn verifier(scheme: SignatureScheme) -> &'static dyn signature::VerificationAlgorithm {
    match scheme {
        SignatureScheme::RSA_PSS_SHA256 => &signature::RSA_PSS_2048_8192_SHA256,
        SignatureScheme::RSA_PSS_SHA384 => &signature::RSA_PSS_2048_8192_SHA384,
        SignatureScheme::RSA_PSS_SHA512 => &signature::RSA_PSS_2048_8192_SHA512,
        SignatureScheme::RSA_PKCS1_SHA256 => &signature::RSA_PKCS1_2048_8192_SHA256,
        SignatureScheme::RSA_PKCS1_SHA384 => &signature::RSA_PKCS1_2048_8192_SHA384,
        SignatureScheme::RSA_PKCS1_SHA512 => &signature::RSA_PKCS1_2048_8192_SHA512,
        SignatureScheme::ECDSA_NISTP256_SHA256 => &signature::ECDSA_P256_SHA256_ASN1,
        SignatureScheme::ECDSA_NISTP384_SHA384 => &signature::ECDSA_P384_SHA384_ASN1,
        other => panic!("no verifier for {other:?}"),
    }
}

/// The request to sign `message` as a keyless terminator sends it: its digest.
fn request(key: &Key, scheme: SignatureScheme, message: &[u8]) -> CryptoOp {
    CryptoOp::SignDigest {
        key: key.pair.clone(),
        scheme,
        digest: digest::digest(scheme_digest(scheme).unwrap(), message)
            .as_ref()
            .to_vec(),
    }
}

fn check(
    key: &Key,
    scheme: SignatureScheme,
    message: &[u8],
    result: Result<CryptoOutput, CryptoError>,
) {
    let Ok(CryptoOutput::Signature(sig)) = result else {
        panic!("{scheme:?}: {result:?}")
    };
    UnparsedPublicKey::new(verifier(scheme), &key.public)
        .verify(message, &sig)
        .unwrap_or_else(|_| {
            panic!("{scheme:?}: the digest's signature does not verify for its message")
        });
}

#[test]
fn scalar_digest_signatures_verify_for_their_messages() {
    for key in keys() {
        for &scheme in key.schemes {
            let message = format!("transcript signed by {scheme:?}").into_bytes();
            check(
                &key,
                scheme,
                &message,
                scalar::compute(request(&key, scheme, &message)),
            );
        }
    }
}

/// A digest that is not the scheme's hash's length, or an ECDSA digest by another
/// curve's hash, is refused: the signer never signs what it cannot take as the scheme
/// says.
#[test]
fn digests_of_the_wrong_length_or_hash_are_refused() {
    let keys = keys();
    let rsa = &keys[0];
    let short = CryptoOp::SignDigest {
        key: rsa.pair.clone(),
        scheme: SignatureScheme::RSA_PSS_SHA256,
        digest: vec![7; 31],
    };
    assert!(scalar::compute(short).is_err());
    let p256 = &keys[1];
    let sha384 = CryptoOp::SignDigest {
        key: p256.pair.clone(),
        scheme: SignatureScheme::ECDSA_NISTP384_SHA384,
        digest: vec![7; 48],
    };
    assert_eq!(
        scalar::compute(sha384).unwrap_err(),
        CryptoError::SchemeMismatch(SignatureScheme::ECDSA_NISTP384_SHA384)
    );
}

/// Eight digest requests of one key type in one crypto_mb call (mixed with message
/// requests, as a signer that is also a server batches them), each verifying for its
/// own message, none computed scalar; then a batch with a digest one byte short and one
/// byte long among valid ones: those two are refused (the scalar path they fall back to
/// refuses them too), every other lane still verifies.
#[test]
fn crypto_mb_batches_digest_signatures_that_verify_for_their_messages() {
    if skip_without_ifma() {
        return;
    }
    for key in keys() {
        let key = Arc::new(key);
        let kind = match key.schemes[0] {
            SignatureScheme::ECDSA_NISTP256_SHA256 | SignatureScheme::ECDSA_NISTP384_SHA384 => {
                OpKind::EcdsaSign
            }
            _ => OpKind::RsaSign,
        };
        on_multibuffer_engine(Arc::default(), |engine, metrics| async move {
            let _guards: Vec<_> = (0..10).map(|_| engine.handshake_started()).collect();
            let tasks: Vec<_> = (0..8)
                .map(|i| {
                    let (e, key) = (engine.clone(), key.clone());
                    let scheme = key.schemes[i % key.schemes.len()];
                    let message = format!("transcript {i}").into_bytes();
                    let op = if i == 3 {
                        CryptoOp::Sign {
                            key: key.pair.clone(),
                            scheme,
                            message: message.clone(),
                        }
                    } else {
                        request(&key, scheme, &message)
                    };
                    tokio::task::spawn_local(async move {
                        let result = e.submit(op, &HandshakeContext::starting_now()).await;
                        (scheme, message, result)
                    })
                })
                .collect();
            for t in tasks {
                let (scheme, message, result) = t.await.unwrap();
                check(&key, scheme, &message, result);
            }
            assert_eq!(metrics.batches(kind), 1, "{kind:?}: one batch of eight");
            assert_eq!(
                metrics.scalar_computed(kind),
                0,
                "{kind:?}: all in the mb8 call"
            );
        });
    }
}
