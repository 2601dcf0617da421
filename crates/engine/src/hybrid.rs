//! Post-quantum hybrid key exchange (X25519MLKEM768, draft-ietf-tls-ecdhe-mlkem): an
//! ML-KEM-768 encapsulation beside an X25519 exchange, shares and secrets concatenated
//! with the KEM's part first.
//!
//! A hybrid request is [split](split) into its KEM part, computed at once with aws-lc
//! (there is no batched ML-KEM: it costs about what one X25519 does), and the request
//! for its classical half, which then goes wherever a plain X25519 request would: a
//! crypto_mb batch or the scalar path. [`join`] puts the two results back together. So
//! every backend computes hybrids the same way, and each one is counted once, under its
//! own [`crate::OpKind`].

use aws_lc_rs::kem::{self, Ciphertext, DecapsulationKey, EncapsulationKey};
use zeroize::Zeroizing;

use crate::op::{CryptoError, CryptoOp, CryptoOutput, HybridPrivateKey, KxGroup, KxPrivateKey};

/// ML-KEM-768's encapsulation key (the client's share) and ciphertext (the server's).
const ENCAPSULATION_KEY_LEN: usize = 1184;
const CIPHERTEXT_LEN: usize = 1088;

/// The KEM's result for one hybrid request, kept while its classical half is computed.
pub(crate) enum KemHalf {
    /// A fresh key pair (the client's share).
    Generated {
        decapsulation: DecapsulationKey,
        encapsulation: Vec<u8>,
    },
    /// An encapsulation to the client's key (the server's share and secret).
    Encapsulated {
        ciphertext: Vec<u8>,
        secret: Zeroizing<Vec<u8>>,
    },
    /// The server's ciphertext opened (the client's secret).
    Decapsulated { secret: Zeroizing<Vec<u8>> },
}

/// Whether `op` is a hybrid exchange, to be [split](split) first.
pub(crate) fn is_hybrid(op: &CryptoOp) -> bool {
    match op {
        CryptoOp::KxGenerate { group }
        | CryptoOp::KxAgree { group, .. }
        | CryptoOp::KxGenerateAgree { group, .. } => group.kem().is_some(),
        CryptoOp::Sign { .. } | CryptoOp::SignDigest { .. } | CryptoOp::RemoteSign { .. } => false,
    }
}

/// Computes the KEM part of the hybrid request `op` and returns it with the request for
/// the classical half. A share of the wrong length or an invalid ML-KEM key is the
/// peer's error, reported as such.
pub(crate) fn split(op: CryptoOp) -> Result<(KemHalf, CryptoOp), CryptoError> {
    match op {
        CryptoOp::KxGenerate { group } => {
            let failed = |_| CryptoError::KeyGenFailed(group.name());
            let decapsulation = DecapsulationKey::generate(kem_of(group)).map_err(failed)?;
            let encapsulation = decapsulation
                .encapsulation_key()
                .and_then(|k| k.key_bytes())
                .map_err(failed)?
                .as_ref()
                .to_vec();
            Ok((
                KemHalf::Generated {
                    decapsulation,
                    encapsulation,
                },
                CryptoOp::KxGenerate {
                    group: group.classical(),
                },
            ))
        }
        CryptoOp::KxGenerateAgree { group, peer_public } => {
            let bad_peer = || CryptoError::BadPeerKey(group.name());
            let (kem_share, classical_share) =
                split_share(&peer_public, ENCAPSULATION_KEY_LEN).ok_or_else(bad_peer)?;
            let key = EncapsulationKey::new(kem_of(group), kem_share).map_err(|_| bad_peer())?;
            // aws-lc runs FIPS 203's modulus check on the key here: a failure is an
            // invalid client key.
            let (ciphertext, secret) = key.encapsulate().map_err(|_| bad_peer())?;
            Ok((
                KemHalf::Encapsulated {
                    ciphertext: ciphertext.as_ref().to_vec(),
                    secret: Zeroizing::new(secret.as_ref().to_vec()),
                },
                CryptoOp::KxGenerateAgree {
                    group: group.classical(),
                    peer_public: classical_share.to_vec(),
                },
            ))
        }
        CryptoOp::KxAgree {
            group,
            private_key,
            peer_public,
        } => {
            let KxPrivateKey::Hybrid(key) = private_key else {
                return Err(CryptoError::KeyMismatch(group.name()));
            };
            let HybridPrivateKey {
                kem: decapsulation,
                classical: classical_key,
            } = *key;
            let bad_peer = || CryptoError::BadPeerKey(group.name());
            let (ciphertext, classical_share) =
                split_share(&peer_public, CIPHERTEXT_LEN).ok_or_else(bad_peer)?;
            // ML-KEM decapsulation of a well-formed ciphertext does not fail: a forged one
            // yields a pseudorandom secret (implicit rejection), and the handshake's
            // Finished check then fails.
            let secret = decapsulation
                .decapsulate(Ciphertext::from(ciphertext))
                .map_err(|_| bad_peer())?;
            Ok((
                KemHalf::Decapsulated {
                    secret: Zeroizing::new(secret.as_ref().to_vec()),
                },
                CryptoOp::KxAgree {
                    group: group.classical(),
                    private_key: classical_key,
                    peer_public: classical_share.to_vec(),
                },
            ))
        }
        CryptoOp::Sign { .. } | CryptoOp::SignDigest { .. } | CryptoOp::RemoteSign { .. } => {
            unreachable!("split is only called for hybrid exchanges")
        }
    }
}

fn kem_of(group: KxGroup) -> &'static kem::Algorithm {
    group
        .kem()
        .expect("split is only called for hybrid exchanges (is_hybrid)")
}

/// The hybrid result from the KEM's part and the classical half's result.
pub(crate) fn join(
    kem: KemHalf,
    classical: Result<CryptoOutput, CryptoError>,
) -> Result<CryptoOutput, CryptoError> {
    match (kem, classical?) {
        (
            KemHalf::Generated {
                decapsulation,
                encapsulation,
            },
            CryptoOutput::KeyPair {
                private_key,
                public,
            },
        ) => Ok(CryptoOutput::KeyPair {
            private_key: KxPrivateKey::Hybrid(Box::new(HybridPrivateKey {
                kem: decapsulation,
                classical: private_key,
            })),
            public: [encapsulation, public].concat(),
        }),
        (
            KemHalf::Encapsulated { ciphertext, secret },
            CryptoOutput::PublicAndShared { public, shared },
        ) => Ok(CryptoOutput::PublicAndShared {
            public: [ciphertext, public].concat(),
            shared: concat_secrets(&secret, &shared),
        }),
        (KemHalf::Decapsulated { secret }, CryptoOutput::Shared(shared)) => {
            Ok(CryptoOutput::Shared(concat_secrets(&secret, &shared)))
        }
        _ => Err(CryptoError::WrongOutput(KxGroup::X25519MlKem768.op_kind())),
    }
}

fn concat_secrets(kem: &[u8], classical: &[u8]) -> Zeroizing<Vec<u8>> {
    let mut secret = Zeroizing::new(Vec::with_capacity(kem.len() + classical.len()));
    secret.extend_from_slice(kem);
    secret.extend_from_slice(classical);
    secret
}

/// (KEM part, classical part) of a share whose KEM part is `kem_len` bytes, if the whole
/// is that plus an X25519 share.
fn split_share(share: &[u8], kem_len: usize) -> Option<(&[u8], &[u8])> {
    (share.len() == kem_len + 32).then(|| share.split_at(kem_len))
}
