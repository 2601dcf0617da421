//! How a request names a key, and which TLS signature scheme an operation is.

use aws_lc_rs::digest;
use rustls::SignatureScheme;
use terminus_engine::KeyAlgorithm;
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;
use x509_parser::x509::SubjectPublicKeyInfo;

use crate::protocol::{Hash, KeyId, Sign};

/// The identities a key is asked for by: its Subject Key Identifier (SHA-1 of the
/// SubjectPublicKeyInfo's key bits, RFC 5280 4.2.1.2 method 1, as gokeyless computes it)
/// and, for RSA, gokeyless's older identity (SHA-256 of the modulus written in uppercase
/// hexadecimal). None for bytes that are not a SubjectPublicKeyInfo.
pub fn key_ids(spki_der: &[u8]) -> Option<(KeyId, Option<KeyId>)> {
    let (_, spki) = SubjectPublicKeyInfo::from_der(spki_der).ok()?;
    let sha1 = digest::digest(
        &digest::SHA1_FOR_LEGACY_USE_ONLY,
        &spki.subject_public_key.data,
    );
    let ski = KeyId::Ski(sha1.as_ref().try_into().ok()?);
    let modulus = match spki.parsed() {
        Ok(PublicKey::RSA(rsa)) => {
            let n = rsa.modulus;
            let n = &n[n.iter().position(|&b| b != 0).unwrap_or(n.len())..];
            let hex: String = n.iter().map(|b| format!("{b:02X}")).collect();
            // Go's %X of a big.Int has no leading zero digit.
            let hex = hex.strip_prefix('0').unwrap_or(&hex);
            let d = digest::digest(&digest::SHA256, hex.as_bytes());
            Some(KeyId::ModulusDigest(d.as_ref().try_into().ok()?))
        }
        _ => None,
    };
    Some((ski, modulus))
}

/// The TLS scheme an operation asks of a key of `algorithm`; None where the key cannot
/// make it (an ECDSA hash that is not its curve's, RSA asked for ECDSA).
pub fn scheme_of(sign: Sign, algorithm: KeyAlgorithm) -> Option<SignatureScheme> {
    use Hash::*;
    Some(match (sign, algorithm) {
        (Sign::RsaPkcs1(Sha256), KeyAlgorithm::Rsa { .. }) => SignatureScheme::RSA_PKCS1_SHA256,
        (Sign::RsaPkcs1(Sha384), KeyAlgorithm::Rsa { .. }) => SignatureScheme::RSA_PKCS1_SHA384,
        (Sign::RsaPkcs1(Sha512), KeyAlgorithm::Rsa { .. }) => SignatureScheme::RSA_PKCS1_SHA512,
        (Sign::RsaPss(Sha256), KeyAlgorithm::Rsa { .. }) => SignatureScheme::RSA_PSS_SHA256,
        (Sign::RsaPss(Sha384), KeyAlgorithm::Rsa { .. }) => SignatureScheme::RSA_PSS_SHA384,
        (Sign::RsaPss(Sha512), KeyAlgorithm::Rsa { .. }) => SignatureScheme::RSA_PSS_SHA512,
        (Sign::Ecdsa(Sha256), KeyAlgorithm::EcdsaP256) => SignatureScheme::ECDSA_NISTP256_SHA256,
        (Sign::Ecdsa(Sha384), KeyAlgorithm::EcdsaP384) => SignatureScheme::ECDSA_NISTP384_SHA384,
        _ => return None,
    })
}

/// The operation that makes a signature of `scheme`; None for a scheme the protocol
/// has no operation for.
pub fn sign_of(scheme: SignatureScheme) -> Option<Sign> {
    use Hash::*;
    Some(match scheme {
        SignatureScheme::RSA_PKCS1_SHA256 => Sign::RsaPkcs1(Sha256),
        SignatureScheme::RSA_PKCS1_SHA384 => Sign::RsaPkcs1(Sha384),
        SignatureScheme::RSA_PKCS1_SHA512 => Sign::RsaPkcs1(Sha512),
        SignatureScheme::RSA_PSS_SHA256 => Sign::RsaPss(Sha256),
        SignatureScheme::RSA_PSS_SHA384 => Sign::RsaPss(Sha384),
        SignatureScheme::RSA_PSS_SHA512 => Sign::RsaPss(Sha512),
        SignatureScheme::ECDSA_NISTP256_SHA256 => Sign::Ecdsa(Sha256),
        SignatureScheme::ECDSA_NISTP384_SHA384 => Sign::Ecdsa(Sha384),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SKI is what OpenSSL writes in a certificate's subjectKeyIdentifier
    /// (`hash`: RFC 5280's first method), and the RSA identity is the SHA-256 of the
    /// modulus as `openssl rsa -modulus` prints it: both checked against OpenSSL, an
    /// implementation apart from this one.
    #[test]
    fn key_ids_match_what_openssl_computes() {
        let dir = terminus_testkit::TestDir::new("keyless-ski");
        for (stem, algorithm) in [
            ("rsa", &["-newkey", "rsa:2048"][..]),
            (
                "p256",
                &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"][..],
            ),
            (
                "p384",
                &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-384"][..],
            ),
        ] {
            let key = dir.path(&format!("{stem}.key"));
            let cert = dir.path(&format!("{stem}.pem"));
            let mut args = vec!["req", "-x509", "-nodes", "-subj", "/CN=k", "-days", "1"];
            args.extend_from_slice(algorithm);
            args.extend(["-addext", "subjectKeyIdentifier=hash", "-outform", "DER"]);
            args.extend([
                "-keyout",
                key.to_str().unwrap(),
                "-out",
                cert.to_str().unwrap(),
            ]);
            terminus_testkit::openssl(&args);
            let der = std::fs::read(&cert).unwrap();
            let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
            let ski = parsed
                .extensions()
                .iter()
                .find_map(|e| match e.parsed_extension() {
                    x509_parser::extensions::ParsedExtension::SubjectKeyIdentifier(k) => {
                        Some(k.0.to_vec())
                    }
                    _ => None,
                })
                .expect("openssl wrote a subjectKeyIdentifier");
            let (ours, modulus) = key_ids(parsed.public_key().raw).unwrap();
            assert_eq!(ours, KeyId::Ski(ski.try_into().unwrap()), "{stem}");
            if stem == "rsa" {
                let printed = terminus_testkit::openssl_stdout(&[
                    "rsa",
                    "-in",
                    key.to_str().unwrap(),
                    "-noout",
                    "-modulus",
                ]);
                let hex = String::from_utf8(printed).unwrap();
                let hex = hex.trim().strip_prefix("Modulus=").unwrap();
                let d = digest::digest(&digest::SHA256, hex.as_bytes());
                assert_eq!(
                    modulus,
                    Some(KeyId::ModulusDigest(d.as_ref().try_into().unwrap()))
                );
            } else {
                assert!(modulus.is_none(), "{stem}: ECDSA has no modulus identity");
            }
        }
    }

    #[test]
    fn every_scheme_round_trips_through_its_operation() {
        for (scheme, alg) in [
            (
                SignatureScheme::RSA_PSS_SHA256,
                KeyAlgorithm::Rsa { bits: 2048 },
            ),
            (
                SignatureScheme::RSA_PSS_SHA384,
                KeyAlgorithm::Rsa { bits: 2048 },
            ),
            (
                SignatureScheme::RSA_PSS_SHA512,
                KeyAlgorithm::Rsa { bits: 2048 },
            ),
            (
                SignatureScheme::RSA_PKCS1_SHA256,
                KeyAlgorithm::Rsa { bits: 2048 },
            ),
            (
                SignatureScheme::RSA_PKCS1_SHA384,
                KeyAlgorithm::Rsa { bits: 2048 },
            ),
            (
                SignatureScheme::RSA_PKCS1_SHA512,
                KeyAlgorithm::Rsa { bits: 2048 },
            ),
            (
                SignatureScheme::ECDSA_NISTP256_SHA256,
                KeyAlgorithm::EcdsaP256,
            ),
            (
                SignatureScheme::ECDSA_NISTP384_SHA384,
                KeyAlgorithm::EcdsaP384,
            ),
        ] {
            assert_eq!(scheme_of(sign_of(scheme).unwrap(), alg), Some(scheme));
        }
        assert_eq!(
            scheme_of(Sign::Ecdsa(Hash::Sha384), KeyAlgorithm::EcdsaP256),
            None
        );
        assert_eq!(
            scheme_of(Sign::Ecdsa(Hash::Sha256), KeyAlgorithm::Rsa { bits: 2048 }),
            None
        );
    }
}
