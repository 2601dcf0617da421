//! The multibuffer backend's bookkeeping on any CPU: everything but the crypto_mb call
//! itself, driven through the reference kernels (`reference.rs`) and checked by aws-lc's
//! verification: RSA encodings, key parsing, lane validation and filler lanes, the mapping
//! of each lane's result to its own request, the RSA result check, peer-point validation,
//! and the nonces and private keys drawn from the CSPRNG. The same paths on crypto_mb are
//! tested in `tests/multibuffer_*.rs` where the CPU has AVX-512 IFMA.

use std::sync::{Arc, OnceLock};

use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::rsa::KeySize;
use aws_lc_rs::signature::{self, EcdsaKeyPair, KeyPair, RsaKeyPair, UnparsedPublicKey};
use rustls::SignatureScheme;

use super::ecdsa::{self, EcKey};
use super::emsa::Encoding;
use super::nist::Curve;
use super::reference::Reference;
use super::rsa::{self, LaneError, RsaCrtKey};
use super::{der, ecdh, kx, pick, x25519, MultibufferBackend};
use crate::HandshakeContext;
use crate::{
    BackendKind, CryptoOp, CryptoOutput, Engine, EngineMetrics, FlushPolicy, KxGroup,
    SigningKeyPair,
};

/// An RSA key: its PKCS#8 DER and PKCS#1 public key.
struct Rsa {
    pkcs8: Vec<u8>,
    public: Vec<u8>,
}

fn rsa_keys() -> &'static [Rsa] {
    static KEYS: OnceLock<Vec<Rsa>> = OnceLock::new();
    KEYS.get_or_init(|| {
        [KeySize::Rsa2048, KeySize::Rsa2048, KeySize::Rsa3072]
            .into_iter()
            .map(|size| {
                let k = RsaKeyPair::generate(size).unwrap();
                Rsa {
                    pkcs8: AsDer::<aws_lc_rs::encoding::Pkcs8V1Der>::as_der(&k)
                        .unwrap()
                        .as_ref()
                        .to_vec(),
                    public: k.public_key().as_ref().to_vec(),
                }
            })
            .collect()
    })
}

fn rsa_verifier(scheme: SignatureScheme) -> &'static dyn signature::VerificationAlgorithm {
    match scheme {
        SignatureScheme::RSA_PSS_SHA256 => &signature::RSA_PSS_2048_8192_SHA256,
        SignatureScheme::RSA_PSS_SHA384 => &signature::RSA_PSS_2048_8192_SHA384,
        SignatureScheme::RSA_PSS_SHA512 => &signature::RSA_PSS_2048_8192_SHA512,
        SignatureScheme::RSA_PKCS1_SHA256 => &signature::RSA_PKCS1_2048_8192_SHA256,
        SignatureScheme::RSA_PKCS1_SHA384 => &signature::RSA_PKCS1_2048_8192_SHA384,
        SignatureScheme::RSA_PKCS1_SHA512 => &signature::RSA_PKCS1_2048_8192_SHA512,
        other => panic!("not an RSA scheme: {other:?}"),
    }
}

const RSA_SCHEMES: [SignatureScheme; 6] = [
    SignatureScheme::RSA_PSS_SHA256,
    SignatureScheme::RSA_PSS_SHA384,
    SignatureScheme::RSA_PSS_SHA512,
    SignatureScheme::RSA_PKCS1_SHA256,
    SignatureScheme::RSA_PKCS1_SHA384,
    SignatureScheme::RSA_PKCS1_SHA512,
];

#[test]
fn pick_keeps_valid_lanes_and_fills_the_rest_with_the_filler() {
    let valid = [false, true, true, false];
    let picked: Vec<usize> = (0..8).map(|i| pick(&valid, 1, i)).collect();
    assert_eq!(picked, [1, 1, 2, 1, 1, 1, 1, 1]);
}

/// Every encoding, through the raw RSA private operation, gives a signature that aws-lc
/// verifies: EMSA-PSS and EMSA-PKCS1-v1_5 for SHA-256/384/512 on 2048- and 3072-bit keys.
/// Every lane signs its own message, so a result given to another lane fails to verify.
#[test]
fn rsa_signatures_of_every_encoding_and_lane_count_verify_with_aws_lc() {
    let keys = rsa_keys();
    for (k, key) in keys.iter().enumerate() {
        let crt = RsaCrtKey::from_der(&key.pkcs8).expect("a CRT key");
        for lanes in 1..=8 {
            let messages: Vec<(SignatureScheme, Vec<u8>)> = (0..lanes)
                .map(|i| {
                    let scheme = RSA_SCHEMES[(i + lanes) % RSA_SCHEMES.len()];
                    (
                        scheme,
                        format!("key {k} lanes {lanes} lane {i}").into_bytes(),
                    )
                })
                .collect();
            let encoded: Vec<Vec<u8>> = messages
                .iter()
                .map(|(scheme, m)| {
                    Encoding::for_scheme(*scheme)
                        .unwrap()
                        .encode(m, crt.bits())
                        .unwrap()
                })
                .collect();
            let inputs: Vec<(&RsaCrtKey, &[u8])> =
                encoded.iter().map(|e| (&crt, e.as_slice())).collect();
            let results = rsa::private_crt_on(&Reference::default(), crt.bits(), &inputs);
            for ((scheme, message), result) in messages.iter().zip(results) {
                let sig = result.unwrap_or_else(|e| panic!("{scheme:?}: {e:?}"));
                UnparsedPublicKey::new(rsa_verifier(*scheme), &key.public)
                    .verify(message, &sig)
                    .unwrap_or_else(|_| panic!("{scheme:?}, {lanes} lanes: does not verify"));
            }
        }
    }
}

#[test]
fn pkcs1_encoding_is_deterministic_and_equals_aws_lc_signatures() {
    let key = &rsa_keys()[0];
    let crt = RsaCrtKey::from_der(&key.pkcs8).unwrap();
    let pair = RsaKeyPair::from_pkcs8(&key.pkcs8).unwrap();
    let message = b"the same message";
    for (scheme, padding) in [
        (
            SignatureScheme::RSA_PKCS1_SHA256,
            &signature::RSA_PKCS1_SHA256,
        ),
        (
            SignatureScheme::RSA_PKCS1_SHA512,
            &signature::RSA_PKCS1_SHA512,
        ),
    ] {
        let encoded = Encoding::for_scheme(scheme)
            .unwrap()
            .encode(message, crt.bits())
            .unwrap();
        let ours = rsa::private_crt_on(&Reference::default(), crt.bits(), &[(&crt, &encoded)])
            .remove(0)
            .unwrap();
        let mut theirs = vec![0u8; pair.public_modulus_len()];
        pair.sign(padding, &SystemRandom::new(), message, &mut theirs)
            .unwrap();
        assert_eq!(ours, theirs, "{scheme:?}");
    }
}

#[test]
fn pss_salts_are_fresh() {
    let enc = Encoding::for_scheme(SignatureScheme::RSA_PSS_SHA256).unwrap();
    let a = enc.encode(b"m", 2048).unwrap();
    let b = enc.encode(b"m", 2048).unwrap();
    assert_eq!(a.len(), 256);
    assert_eq!(a[255], 0xbc);
    assert_ne!(a, b, "a random salt per signature");
}

/// A lane whose result does not survive the public-exponent check is withheld (a faulty
/// CRT result would leak the key); the other lanes are released and verify.
#[test]
fn a_corrupted_rsa_result_is_never_released() {
    let key = &rsa_keys()[0];
    let crt = RsaCrtKey::from_der(&key.pkcs8).unwrap();
    let enc = Encoding::for_scheme(SignatureScheme::RSA_PSS_SHA256).unwrap();
    let messages: Vec<Vec<u8>> = (0..8).map(|i| format!("m{i}").into_bytes()).collect();
    let encoded: Vec<Vec<u8>> = messages
        .iter()
        .map(|m| enc.encode(m, 2048).unwrap())
        .collect();
    let inputs: Vec<(&RsaCrtKey, &[u8])> = encoded.iter().map(|e| (&crt, e.as_slice())).collect();
    let kernels = Reference::default();
    kernels.corrupt_rsa_lane.set(Some(3));
    let results = rsa::private_crt_on(&kernels, 2048, &inputs);
    for (i, (result, message)) in results.into_iter().zip(&messages).enumerate() {
        if i == 3 {
            assert_eq!(result, Err(LaneError::CheckFailed));
        } else {
            UnparsedPublicKey::new(&signature::RSA_PSS_2048_8192_SHA256, &key.public)
                .verify(message, &result.unwrap())
                .unwrap();
        }
    }
}

#[test]
fn a_lane_status_error_fails_that_lane_only() {
    let key = &rsa_keys()[0];
    let crt = RsaCrtKey::from_der(&key.pkcs8).unwrap();
    let enc = Encoding::for_scheme(SignatureScheme::RSA_PKCS1_SHA256).unwrap();
    let encoded: Vec<Vec<u8>> = (0..6).map(|i| enc.encode(&[i], 2048).unwrap()).collect();
    let inputs: Vec<(&RsaCrtKey, &[u8])> = encoded.iter().map(|e| (&crt, e.as_slice())).collect();
    let kernels = Reference::default();
    kernels
        .fail_lane
        .set(Some((5, crypto_mb_sys::MBX_STATUS_NULL_PARAM_ERR)));
    let results = rsa::private_crt_on(&kernels, 2048, &inputs);
    assert!(results[..5].iter().all(Result::is_ok), "{results:?}");
    assert_eq!(
        results[5],
        Err(LaneError::Status(crypto_mb_sys::MBX_STATUS_NULL_PARAM_ERR))
    );
}

/// Inputs the kernel cannot take (not below the modulus, wrong length, key of another
/// size) fail their own lane before the call, and their slots, like the unused lanes,
/// carry a valid lane's inputs: the kernel never sees garbage.
#[test]
fn invalid_rsa_lanes_fail_alone_and_are_filled_with_a_valid_lane() {
    let keys = rsa_keys();
    let small = RsaCrtKey::from_der(&keys[0].pkcs8).unwrap();
    let big = RsaCrtKey::from_der(&keys[2].pkcs8).unwrap();
    let enc = Encoding::for_scheme(SignatureScheme::RSA_PSS_SHA256).unwrap();
    let good_a = enc.encode(b"a", 2048).unwrap();
    let good_b = enc.encode(b"b", 2048).unwrap();
    let too_big = vec![0xff; 256];
    let short = vec![0x01; 255];
    let inputs: Vec<(&RsaCrtKey, &[u8])> = vec![
        (&small, &too_big),
        (&small, &good_a),
        (&small, &short),
        (&big, &good_b[..]),
        (&small, &good_b),
    ];
    let kernels = Reference::default();
    let results = rsa::private_crt_on(&kernels, 2048, &inputs);
    for i in [0, 2, 3] {
        assert_eq!(results[i], Err(LaneError::BadInput), "lane {i}");
    }
    assert!(results[1].is_ok() && results[4].is_ok());
    let call = kernels.calls.borrow()[0].clone();
    assert_eq!(call.kernel, "rsa_private_crt");
    for (i, given) in call.lanes.iter().enumerate() {
        // Lane 4 is the other valid one; every other slot carries the first valid lane.
        let expected = if i == 4 { &good_b } else { &good_a };
        assert_eq!(given, expected, "lane {i} of the kernel call");
    }
    let all_bad = rsa::private_crt_on(&kernels, 2048, &[(&small, &too_big)]);
    assert_eq!(all_bad, [Err(LaneError::BadInput)]);
    assert_eq!(
        kernels.calls.borrow().len(),
        1,
        "no call with no valid lane"
    );
}

#[test]
fn rsa_keys_are_parsed_from_pkcs8_and_pkcs1_and_unusable_ones_refused() {
    let key = &rsa_keys()[0];
    let pkcs8 = RsaCrtKey::from_der(&key.pkcs8).expect("PKCS#8");
    let c = der::rsa_components(&key.pkcs8).unwrap();
    let n = c.n.clone();
    assert_eq!(pkcs8.bits(), 2048);
    assert_eq!(n.len(), 256);
    assert_eq!(c.e, [1, 0, 1]);
    // The limbs are the modulus, little-endian.
    let mut from_limbs: Vec<u8> = pkcs8.n().iter().flat_map(|l| l.to_le_bytes()).collect();
    from_limbs.reverse();
    assert_eq!(from_limbs, n);
    // Truncated or padded DER, and other key sizes and exponents, are refused.
    assert!(RsaCrtKey::from_der(&key.pkcs8[..key.pkcs8.len() - 1]).is_none());
    assert!(RsaCrtKey::from_der(&key.pkcs8[1..]).is_none());
    assert!(RsaCrtKey::from_der(b"").is_none());
    let e3 = openssl_rsa_der(&["-pkeyopt", "rsa_keygen_pubexp:3"]);
    assert!(der::rsa_components(&e3).is_some(), "parses");
    assert!(RsaCrtKey::from_der(&e3).is_none(), "e = 3 refused");
    let small = openssl_rsa_der(&["-pkeyopt", "rsa_keygen_bits:1024"]);
    assert!(RsaCrtKey::from_der(&small).is_none(), "1024 bits refused");
    let pkcs1 = openssl_rsa_pkcs1_der();
    assert!(
        RsaCrtKey::from_der(&pkcs1).is_some(),
        "PKCS#1 RSAPrivateKey"
    );
}

/// An RSA key made by the openssl CLI (PKCS#8 DER), for shapes aws-lc will not generate.
fn openssl_rsa_der(opts: &[&str]) -> Vec<u8> {
    let dir = std::env::temp_dir().join(format!("terminus-mb-der-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pem = dir.join(format!("k{}.pem", opts.join("").len()));
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        out.stdout
    };
    let mut gen = vec!["genpkey", "-algorithm", "RSA"];
    gen.extend_from_slice(opts);
    gen.extend(["-out", pem.to_str().unwrap()]);
    run(&gen);
    run(&["pkey", "-in", pem.to_str().unwrap(), "-outform", "DER"])
}

fn openssl_rsa_pkcs1_der() -> Vec<u8> {
    let pkcs8 = openssl_rsa_der(&["-pkeyopt", "rsa_keygen_bits:2048"]);
    let dir = std::env::temp_dir().join(format!("terminus-mb-der-{}", std::process::id()));
    let path = dir.join("pkcs8.der");
    std::fs::write(&path, pkcs8).unwrap();
    let out = std::process::Command::new("openssl")
        .args(["rsa", "-inform", "DER", "-in", path.to_str().unwrap()])
        .args(["-outform", "DER", "-traditional"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    out.stdout
}

fn openssl_ec_sec1_der(curve: &str) -> Vec<u8> {
    let out = std::process::Command::new("openssl")
        .args([
            "ecparam", "-name", curve, "-genkey", "-noout", "-outform", "DER",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    out.stdout
}

fn ec_key(curve: Curve) -> (Vec<u8>, Vec<u8>) {
    let alg = match curve {
        Curve::P256 => &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        Curve::P384 => &signature::ECDSA_P384_SHA384_ASN1_SIGNING,
    };
    let k = EcdsaKeyPair::generate(alg).unwrap();
    (
        k.to_pkcs8v1().unwrap().as_ref().to_vec(),
        k.public_key().as_ref().to_vec(),
    )
}

/// ECDSA from the reference kernel's definition, through the batching code, verifies with
/// aws-lc for every lane count on both curves with keys mixed; the nonces the kernel was
/// given are valid, distinct and never reused across calls.
#[test]
fn ecdsa_signatures_verify_and_every_nonce_is_fresh() {
    for (curve, verifier) in [
        (Curve::P256, &signature::ECDSA_P256_SHA256_ASN1),
        (Curve::P384, &signature::ECDSA_P384_SHA384_ASN1),
    ] {
        let keys: Vec<(Vec<u8>, Vec<u8>)> = (0..3).map(|_| ec_key(curve)).collect();
        let parsed: Vec<EcKey> = keys
            .iter()
            .map(|(der, _)| EcKey::from_der(curve, der).expect("PKCS#8 EC key"))
            .collect();
        let kernels = Reference::default();
        for lanes in 1..=8 {
            let messages: Vec<Vec<u8>> = (0..lanes)
                .map(|i| format!("{curve:?} {lanes} {i}").into_bytes())
                .collect();
            let inputs: Vec<(&EcKey, &[u8])> = messages
                .iter()
                .enumerate()
                .map(|(i, m)| (&parsed[i % 3], m.as_slice()))
                .collect();
            for (i, result) in ecdsa::sign_on(&kernels, &inputs).into_iter().enumerate() {
                UnparsedPublicKey::new(verifier, &keys[i % 3].1)
                    .verify(&messages[i], &result.unwrap())
                    .unwrap_or_else(|_| panic!("{curve:?} lane {i} of {lanes}"));
            }
        }
        let calls = kernels.calls.borrow();
        let mut nonces: Vec<&Vec<u8>> = Vec::new();
        for (c, call) in calls.iter().enumerate() {
            assert_eq!(call.kernel, "ecdsa_sign");
            // Lanes past the requests repeat lane 0's nonce (a filler), never a new one.
            let used = c + 1;
            for nonce in &call.lanes[used..] {
                assert_eq!(nonce, &call.lanes[0]);
            }
            nonces.extend(&call.lanes[..used]);
        }
        for n in &nonces {
            assert!(curve.is_valid_scalar(n), "nonce in [1, n-1]");
        }
        let mut unique = nonces.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), nonces.len(), "{curve:?}: a nonce was reused");
    }
}

#[test]
fn ec_keys_are_parsed_from_pkcs8_and_sec1_and_the_wrong_curve_refused() {
    let (pkcs8, _) = ec_key(Curve::P256);
    assert!(EcKey::from_der(Curve::P256, &pkcs8).is_some());
    assert!(
        EcKey::from_der(Curve::P384, &pkcs8).is_none(),
        "P-256 key as P-384"
    );
    let parsed = der::ec_private_key(&pkcs8).unwrap();
    assert_eq!(parsed.scalar.len(), 32);
    assert_eq!(parsed.curve.as_deref(), Some(Curve::P256.oid()));
    let (p384, _) = ec_key(Curve::P384);
    assert!(EcKey::from_der(Curve::P384, &p384).is_some());
    assert!(
        EcKey::from_der(Curve::P256, &p384).is_none(),
        "P-384 key as P-256"
    );
    assert!(
        EcKey::from_der(Curve::P256, &pkcs8[1..]).is_none(),
        "not DER"
    );
    // SEC1 as openssl writes it (with the named curve) parses, and is checked the same.
    let sec1 = openssl_ec_sec1_der("prime256v1");
    assert!(EcKey::from_der(Curve::P256, &sec1).is_some(), "SEC1");
    assert!(
        EcKey::from_der(Curve::P384, &sec1).is_none(),
        "SEC1 P-256 as P-384"
    );
}

/// SEC1 `ECPrivateKey` DER with `scalar`, naming `oid` as its curve if given.
fn sec1_der(scalar: &[u8], oid: Option<&[u8]>) -> Vec<u8> {
    fn tlv(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![tag, body.len() as u8];
        out.extend_from_slice(body);
        out
    }
    let mut body = tlv(0x02, &[1]);
    body.extend(tlv(0x04, scalar));
    if let Some(oid) = oid {
        body.extend(tlv(0xa0, &tlv(0x06, oid)));
    }
    tlv(0x30, &body)
}

/// A scalar with its leading zero byte dropped (some encoders write them so) is the same
/// key when the DER names the curve; with no curve named, only the exact length is
/// accepted, so a P-256 scalar is never taken for a P-384 one.
#[test]
fn short_ec_scalars_are_padded_only_when_the_curve_is_named() {
    let mut scalar = [0u8; 32];
    aws_lc_rs::rand::SecureRandom::fill(&SystemRandom::new(), &mut scalar[1..]).unwrap();
    scalar[1] |= 1;
    let named = EcKey::from_der(
        Curve::P256,
        &sec1_der(&scalar[1..], Some(Curve::P256.oid())),
    )
    .expect("a short scalar that names P-256");
    let public = aws_public(KxGroup::Secp256r1, &scalar);
    let sig = ecdsa::sign_on(&Reference::default(), &[(&named, b"m")])
        .remove(0)
        .unwrap();
    UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_ASN1, &public)
        .verify(b"m", &sig)
        .expect("the padded scalar is the same key");
    assert!(EcKey::from_der(Curve::P256, &sec1_der(&scalar[1..], None)).is_none());
    assert!(EcKey::from_der(Curve::P256, &sec1_der(&scalar, None)).is_some());
    assert!(EcKey::from_der(Curve::P384, &sec1_der(&scalar, None)).is_none());
    let other = Some(Curve::P384.oid());
    assert!(EcKey::from_der(Curve::P256, &sec1_der(&scalar, other)).is_none());
}

#[test]
fn der_signatures_use_minimal_integers() {
    // Through the reference kernel, an r or s with high bit set gets a leading zero and
    // one with leading zero bytes is shortened; aws-lc verification (above) depends on it,
    // here the shape is checked directly over many signatures.
    let (der, _) = ec_key(Curve::P256);
    let key = EcKey::from_der(Curve::P256, &der).unwrap();
    let kernels = Reference::default();
    for i in 0..64u32 {
        let m = i.to_be_bytes();
        let sig = ecdsa::sign_on(&kernels, &[(&key, &m)]).remove(0).unwrap();
        assert_eq!(sig[0], 0x30);
        assert_eq!(sig[1] as usize, sig.len() - 2);
        let mut rest = &sig[2..];
        for _ in 0..2 {
            assert_eq!(rest[0], 0x02);
            let len = rest[1] as usize;
            let v = &rest[2..2 + len];
            assert!(v[0] & 0x80 == 0, "positive");
            assert!(len == 1 || v[0] != 0 || v[1] & 0x80 != 0, "minimal");
            rest = &rest[2 + len..];
        }
        assert!(rest.is_empty());
    }
}

fn aws_public(group: KxGroup, private: &[u8]) -> Vec<u8> {
    aws_lc_rs::agreement::PrivateKey::from_private_key(group.algorithm(), private)
        .unwrap()
        .compute_public_key()
        .unwrap()
        .as_ref()
        .to_vec()
}

/// Key exchange lanes through the batching code: each lane's public key and shared secret
/// are those aws-lc computes for that lane's own inputs.
#[test]
fn key_exchange_lanes_map_to_their_own_requests() {
    let rng = SystemRandom::new();
    for group in [KxGroup::X25519, KxGroup::Secp256r1, KxGroup::Secp384r1] {
        for lanes in [1, 5, 8] {
            let privs: Vec<_> = (0..lanes)
                .map(|_| kx::random_private(group, &rng).unwrap())
                .collect();
            let peers: Vec<_> = (0..lanes)
                .map(|_| kx::random_private(group, &rng).unwrap())
                .collect();
            let peer_publics: Vec<Vec<u8>> = peers.iter().map(|p| aws_public(group, p)).collect();
            let keys: Vec<&[u8]> = privs.iter().map(|k| k.as_slice()).collect();
            let publics = kx::public_keys_on(&Reference::default(), group, &keys);
            let pairs: Vec<(&[u8], &[u8])> = privs
                .iter()
                .zip(&peer_publics)
                .map(|(k, p)| (k.as_slice(), p.as_slice()))
                .collect();
            let secrets = kx::shared_secrets_on(&Reference::default(), group, &pairs);
            for i in 0..lanes {
                assert_eq!(
                    publics[i].as_ref().unwrap(),
                    &aws_public(group, &privs[i]),
                    "{group:?} lane {i}"
                );
                // The peer computes the same secret from its side.
                let peer_secret = kx::shared_secrets_on(
                    &Reference::default(),
                    group,
                    &[(&peers[i], publics[i].as_ref().unwrap())],
                );
                assert_eq!(
                    **secrets[i].as_ref().unwrap(),
                    **peer_secret[0].as_ref().unwrap(),
                    "{group:?} lane {i}"
                );
            }
        }
    }
}

/// Hybrid (X25519MLKEM768) requests through the batching code: each lane's X25519 half in
/// the batch and its ML-KEM part beside it, put back together in its own lane, agree with
/// rustls's own hybrid (the independent implementation) as server and as client.
#[test]
fn hybrid_lanes_map_to_their_own_requests() {
    use rustls::crypto::aws_lc_rs::kx_group::X25519MLKEM768;
    let group = KxGroup::X25519MlKem768;
    for lanes in [1, 5, 8] {
        let clients: Vec<_> = (0..lanes)
            .map(|_| X25519MLKEM768.start().unwrap())
            .collect();
        let mut ops: Vec<CryptoOp> = clients
            .iter()
            .map(|c| CryptoOp::KxGenerateAgree {
                group,
                peer_public: c.pub_key().to_vec(),
            })
            .collect();
        ops.push(CryptoOp::KxGenerate { group });
        let batch = kx::compute_on(&Reference::default(), group, ops);
        assert_eq!((batch.computed_scalar, batch.fallbacks.len()), (0, 0));
        let mut results = batch.results;
        let Ok(CryptoOutput::KeyPair {
            private_key,
            public,
        }) = results.pop().unwrap()
        else {
            panic!("generate")
        };
        for (i, (client, result)) in clients.into_iter().zip(results).enumerate() {
            let Ok(CryptoOutput::PublicAndShared { public, shared }) = result else {
                panic!("lane {i}: {result:?}")
            };
            let theirs = client.complete(&public).unwrap();
            assert_eq!(
                theirs.secret_bytes(),
                &shared[..],
                "{lanes} lanes, lane {i}"
            );
        }
        let server = X25519MLKEM768.start_and_complete(&public).unwrap();
        let agreed = kx::compute_on(
            &Reference::default(),
            group,
            vec![CryptoOp::KxAgree {
                group,
                private_key,
                peer_public: server.pub_key.clone(),
            }],
        )
        .results;
        let Ok(CryptoOutput::Shared(ours)) = &agreed[0] else {
            panic!("{:?}", agreed[0])
        };
        assert_eq!(&ours[..], server.secret.secret_bytes());
    }
}

/// Peer points that must be refused, each in its own lane beside a good one: wrong
/// length, compressed or infinity encodings, coordinates not below p (checked before the
/// kernel), and points off the curve (the kernel's lane fails; an invalid-curve attack
/// needs exactly such points). The good lane still agrees.
#[test]
fn bad_peer_points_fail_their_own_lane() {
    let rng = SystemRandom::new();
    for (group, curve) in [
        (KxGroup::Secp256r1, Curve::P256),
        (KxGroup::Secp384r1, Curve::P384),
    ] {
        let len = curve.byte_len();
        let good = aws_public(group, &kx::random_private(group, &rng).unwrap());
        let mut off_curve = good.clone();
        off_curve[2 * len] ^= 1;
        let mut x_is_p = good.clone();
        x_is_p[1..1 + len].copy_from_slice(curve.prime());
        let mut y_above_p = good.clone();
        y_above_p[1 + len..].fill(0xff);
        let mut compressed = vec![0x02 | (good[2 * len] & 1)];
        compressed.extend_from_slice(&good[1..1 + len]);
        let mut zero = vec![0x04];
        zero.extend(vec![0; 2 * len]);
        let bad: Vec<(&str, Vec<u8>)> = vec![
            ("off the curve", off_curve),
            ("x = p", x_is_p),
            ("y > p", y_above_p),
            ("compressed", compressed),
            ("(0, 0)", zero),
            ("infinity", vec![0x00]),
            ("truncated", good[..good.len() - 1].to_vec()),
        ];
        let private = kx::random_private(group, &rng).unwrap();
        for (what, point) in &bad {
            let pairs = [
                (private.as_slice(), good.as_slice()),
                (&private, &point[..]),
            ];
            let results = ecdh::shared_secrets_on(&Reference::default(), curve, &pairs);
            assert!(results[0].is_ok(), "{group:?}: good lane beside {what}");
            assert!(results[1].is_err(), "{group:?}: {what} accepted");
        }
    }
    // X25519: a low-order peer (here the all-zero point) gives the all-zero secret, which
    // is refused in its own lane.
    let k = kx::random_private(KxGroup::X25519, &rng).unwrap();
    let good = aws_public(KxGroup::X25519, &k);
    let zero = [0u8; 32];
    let results = x25519::shared_secrets_on(
        &Reference::default(),
        &[(&k, &good), (&k, &zero), (&k, &good[..31])],
    );
    assert!(results[0].is_ok());
    assert_eq!(
        results[1],
        Err(LaneError::Status(crypto_mb_sys::MBX_STATUS_LOW_ORDER_ERR))
    );
    assert_eq!(results[2], Err(LaneError::BadInput));
}

/// The CSPRNG's scalars (ECDSA nonces, ECDH private keys) and X25519 keys: every draw in
/// range, and every bit a fair coin. A generator that left a bit fixed, or biased the top
/// byte (the classic truncated-nonce bug), fails by far more than the bound.
#[test]
fn private_scalars_are_in_range_and_unbiased() {
    const DRAWS: usize = 20_000;
    let rng = SystemRandom::new();
    for group in [KxGroup::X25519, KxGroup::Secp256r1, KxGroup::Secp384r1] {
        let mut ones = Vec::new();
        let mut top = [0usize; 256];
        for _ in 0..DRAWS {
            let k = kx::random_private(group, &rng).unwrap();
            if let Some(curve) = match group {
                KxGroup::Secp256r1 => Some(Curve::P256),
                KxGroup::Secp384r1 => Some(Curve::P384),
                _ => None,
            } {
                assert!(
                    curve.is_valid_scalar(&k),
                    "{group:?}: scalar out of [1, n-1]"
                );
            }
            ones.resize(k.len() * 8, 0usize);
            for (byte, b) in k.iter().enumerate() {
                for bit in 0..8 {
                    ones[byte * 8 + bit] += (b >> bit & 1) as usize;
                }
            }
            top[k[0] as usize] += 1;
        }
        // Each bit: binomial(DRAWS, 1/2), sd = sqrt(DRAWS)/2 ~ 71; 7 sd is never reached
        // by chance over a few hundred bits (p < 1e-9).
        let sd = (DRAWS as f64).sqrt() / 2.0;
        for (bit, &n) in ones.iter().enumerate() {
            let z = (n as f64 - DRAWS as f64 / 2.0).abs() / sd;
            assert!(z < 7.0, "{group:?}: bit {bit} set {n} of {DRAWS} times");
        }
        // The top byte over 256 bins: chi-square with 255 degrees of freedom has mean 255
        // and sd ~22.6; 420 is beyond 7 sd.
        let expected = DRAWS as f64 / 256.0;
        let chi2: f64 = top
            .iter()
            .map(|&o| (o as f64 - expected).powi(2) / expected)
            .sum();
        assert!(chi2 < 420.0, "{group:?}: top byte chi-square {chi2}");
    }
}

/// Submits `ops` concurrently to an engine on the multibuffer backend with `kernels` (one
/// batch per kind, every handshake parked), and returns their results in order.
fn through_the_engine(
    kernels: Reference,
    ops: Vec<CryptoOp>,
) -> (
    Vec<Result<CryptoOutput, crate::CryptoError>>,
    Arc<EngineMetrics>,
) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    tokio::task::LocalSet::new().block_on(&rt, async {
        let metrics = Arc::new(EngineMetrics::new(BackendKind::Multibuffer));
        let backend = MultibufferBackend::on(Box::new(kernels), metrics.clone());
        let engine = Engine::new(Box::new(backend), FlushPolicy::default(), metrics.clone());
        let _guards: Vec<_> = (0..ops.len() + 1)
            .map(|_| engine.handshake_started())
            .collect();
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
        (results, metrics)
    })
}

/// The whole multibuffer backend on the reference kernels, under the engine: eight
/// concurrent requests of one batch (RSA signatures with two keys and schemes mixed), each
/// answered with a signature that verifies for its own message only.
#[test]
fn the_backend_answers_every_request_with_its_own_result() {
    let keys = rsa_keys();
    let pairs: Vec<Arc<SigningKeyPair>> = keys[..2]
        .iter()
        .map(|k| Arc::new(SigningKeyPair::from_der(&k.pkcs8).unwrap()))
        .collect();
    let requests: Vec<(SignatureScheme, Vec<u8>)> = (0..8)
        .map(|i| {
            let scheme = RSA_SCHEMES[i % RSA_SCHEMES.len()];
            (scheme, format!("transcript {i}").into_bytes())
        })
        .collect();
    let ops = requests
        .iter()
        .enumerate()
        .map(|(i, (scheme, message))| CryptoOp::Sign {
            key: pairs[i % 2].clone(),
            scheme: *scheme,
            message: message.clone(),
        })
        .collect();
    let (results, metrics) = through_the_engine(Reference::default(), ops);
    for (i, ((scheme, message), result)) in requests.iter().zip(results).enumerate() {
        let Ok(CryptoOutput::Signature(sig)) = result else {
            panic!("request {i}: {result:?}")
        };
        let verifier = UnparsedPublicKey::new(rsa_verifier(*scheme), &keys[i % 2].public);
        verifier
            .verify(message, &sig)
            .unwrap_or_else(|_| panic!("request {i} got another request's signature"));
    }
    let rsa = crate::OpKind::RsaSign;
    assert_eq!(metrics.batches(rsa), 1, "one batch of eight");
    assert_eq!(
        metrics.scalar_computed(rsa),
        0,
        "all eight in the 8-lane call"
    );
}

/// A faulty kernel costs its request a scalar operation, not its handshake: an RSA lane
/// whose result fails its check, and a lane the kernel reports failed (a signature, a
/// key share), are computed again on the scalar path, answered correctly and counted by
/// cause. A peer's bad key is refused all the same, and is no fallback.
#[test]
fn requests_a_faulty_lane_fails_are_computed_scalar_and_counted() {
    use crate::{FallbackCause, OpKind};
    let key = &rsa_keys()[0];
    let pair = Arc::new(SigningKeyPair::from_der(&key.pkcs8).unwrap());
    let sign = |i: usize| CryptoOp::Sign {
        key: pair.clone(),
        scheme: SignatureScheme::RSA_PSS_SHA256,
        message: format!("m{i}").into_bytes(),
    };
    let lane_error = crypto_mb_sys::MBX_STATUS_NULL_PARAM_ERR;
    for (corrupt, fail, cause) in [
        (Some(3), None, FallbackCause::CheckFailed),
        (None, Some((5, lane_error)), FallbackCause::LaneError),
    ] {
        let kernels = Reference::default();
        kernels.corrupt_rsa_lane.set(corrupt);
        kernels.fail_lane.set(fail);
        let (results, metrics) = through_the_engine(kernels, (0..8).map(sign).collect());
        for (i, result) in results.into_iter().enumerate() {
            let Ok(CryptoOutput::Signature(sig)) = result else {
                panic!("{cause:?}: request {i}: {result:?}")
            };
            UnparsedPublicKey::new(&signature::RSA_PSS_2048_8192_SHA256, &key.public)
                .verify(format!("m{i}").as_bytes(), &sig)
                .unwrap_or_else(|_| panic!("{cause:?}: request {i} does not verify"));
        }
        assert_eq!(metrics.fallbacks(OpKind::RsaSign, cause), 1, "{cause:?}");
        assert_eq!(metrics.batches(OpKind::RsaSign), 1);
    }
    // Key shares: lane 2's public key fails; a low-order peer in lane 6 is refused.
    let group = KxGroup::X25519;
    let peer = aws_public(
        group,
        &kx::random_private(group, &SystemRandom::new()).unwrap(),
    );
    let ops = (0..8)
        .map(|i| CryptoOp::KxGenerateAgree {
            group,
            peer_public: if i == 6 { vec![0; 32] } else { peer.clone() },
        })
        .collect();
    let kernels = Reference::default();
    kernels.fail_lane.set(Some((2, lane_error)));
    let (results, metrics) = through_the_engine(kernels, ops);
    for (i, result) in results.iter().enumerate() {
        match (i, result) {
            (6, Err(crate::CryptoError::BadPeerKey(_))) => {}
            (6, other) => panic!("a low-order peer was accepted: {other:?}"),
            (_, Ok(CryptoOutput::PublicAndShared { public, shared })) => {
                assert_eq!((public.len(), shared.len()), (32, 32), "lane {i}")
            }
            (_, other) => panic!("lane {i}: {other:?}"),
        }
    }
    assert_eq!(
        metrics.fallbacks(OpKind::X25519, FallbackCause::LaneError),
        1
    );
    assert_eq!(
        metrics.fallbacks(OpKind::X25519, FallbackCause::BadInput),
        0
    );
}
