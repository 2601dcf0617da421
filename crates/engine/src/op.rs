//! The operations a handshake asks the engine for, and their results.

use std::fmt;
use std::sync::Arc;

use aws_lc_rs::{agreement, kem};
use rustls::{NamedGroup, SignatureScheme};
use zeroize::Zeroizing;

use crate::remote::RemoteKey;
use crate::signing_key::SigningKeyPair;

/// Key-exchange groups that run through the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KxGroup {
    /// Curve25519 (RFC 7748).
    X25519,
    /// NIST P-256.
    Secp256r1,
    /// NIST P-384.
    Secp384r1,
    /// The post-quantum hybrid of ML-KEM-768 and X25519 (draft-ietf-tls-ecdhe-mlkem),
    /// TLS 1.3 only: see [`crate::hybrid`].
    X25519MlKem768,
}

impl KxGroup {
    /// Every group, in the order terminus offers them: the hybrid first, as browsers and
    /// rustls order them.
    pub const ALL: [KxGroup; 4] = [
        KxGroup::X25519MlKem768,
        KxGroup::X25519,
        KxGroup::Secp256r1,
        KxGroup::Secp384r1,
    ];

    /// The groups without a post-quantum part: what a client comparing servers that
    /// cannot offer one (nginx on OpenSSL 3.0) offers by default.
    pub const CLASSICAL: [KxGroup; 3] = [KxGroup::X25519, KxGroup::Secp256r1, KxGroup::Secp384r1];

    /// The group's TLS code point.
    pub fn named_group(self) -> NamedGroup {
        match self {
            KxGroup::X25519 => NamedGroup::X25519,
            KxGroup::Secp256r1 => NamedGroup::secp256r1,
            KxGroup::Secp384r1 => NamedGroup::secp384r1,
            KxGroup::X25519MlKem768 => NamedGroup::X25519MLKEM768,
        }
    }

    /// The elliptic-curve exchange in the group: itself, or a hybrid's classical half.
    pub fn classical(self) -> KxGroup {
        match self {
            KxGroup::X25519MlKem768 => KxGroup::X25519,
            group => group,
        }
    }

    /// The hybrid's post-quantum KEM, None for a classical group.
    pub fn kem(self) -> Option<&'static kem::Algorithm> {
        match self {
            KxGroup::X25519MlKem768 => Some(&kem::ML_KEM_768),
            _ => None,
        }
    }

    /// Whether TLS 1.2 can use the group (hybrids are defined for TLS 1.3 only).
    pub fn tls12(self) -> bool {
        self.kem().is_none()
    }

    /// aws-lc-rs's ECDH algorithm for the group's [classical](Self::classical) exchange.
    pub fn algorithm(self) -> &'static agreement::Algorithm {
        match self.classical() {
            KxGroup::X25519 | KxGroup::X25519MlKem768 => &agreement::X25519,
            KxGroup::Secp256r1 => &agreement::ECDH_P256,
            KxGroup::Secp384r1 => &agreement::ECDH_P384,
        }
    }

    /// The name used in configuration files and metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            KxGroup::X25519 => "x25519",
            KxGroup::Secp256r1 => "secp256r1",
            KxGroup::Secp384r1 => "secp384r1",
            KxGroup::X25519MlKem768 => "x25519mlkem768",
        }
    }

    /// The group configuration names (`x25519mlkem768`, `x25519`, `secp256r1`,
    /// `secp384r1`, `P-256`, `P-384`), in any case.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| {
            g.name().eq_ignore_ascii_case(name)
                || matches!(
                    (g, name),
                    (KxGroup::Secp256r1, "P-256") | (KxGroup::Secp384r1, "P-384")
                )
        })
    }

    /// The engine queue the group's operations go to.
    pub fn op_kind(self) -> OpKind {
        match self {
            KxGroup::X25519 => OpKind::X25519,
            KxGroup::Secp256r1 => OpKind::P256,
            KxGroup::Secp384r1 => OpKind::P384,
            KxGroup::X25519MlKem768 => OpKind::X25519MlKem768,
        }
    }
}

/// An ephemeral key-exchange private key, in the form of the backend that made it;
/// each backend can complete an exchange started by the other. Zeroized when dropped
/// (aws-lc-rs does so for its keys).
pub enum KxPrivateKey {
    /// A key aws-lc-rs generated (the scalar backend's).
    AwsLc(agreement::PrivateKey),
    /// A private key the multi-buffer kernels drew from the OS CSPRNG: X25519's 32 bytes
    /// or a NIST curve's big-endian scalar.
    Raw(Zeroizing<Vec<u8>>),
    /// A hybrid group's two halves.
    Hybrid(Box<HybridPrivateKey>),
}

/// The private half of a hybrid key share (a client's, kept until the server's share
/// arrives).
pub struct HybridPrivateKey {
    /// The KEM decapsulation key (aws-lc zeroizes it).
    pub kem: kem::DecapsulationKey,
    /// The classical exchange's private key.
    pub classical: KxPrivateKey,
}

impl KxPrivateKey {
    /// The classical exchange's key: a hybrid's classical half, or the key itself. A
    /// client that offered a hybrid's classical half as its own share, and saw the
    /// server choose it, completes with this.
    pub fn into_classical(self) -> KxPrivateKey {
        match self {
            KxPrivateKey::Hybrid(h) => h.classical,
            key => key,
        }
    }
}

impl fmt::Debug for KxPrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KxPrivateKey(..)")
    }
}

/// One unit of handshake public-key work.
pub enum CryptoOp {
    /// Sign `message` (unhashed, as rustls passes it) with `key` using `scheme`.
    Sign {
        /// The certificate's private key.
        key: Arc<SigningKeyPair>,
        /// The scheme the client and rustls chose.
        scheme: SignatureScheme,
        /// The bytes to sign.
        message: Vec<u8>,
    },
    /// Sign a digest someone else computed with `key` using `scheme`, whose hash made
    /// it: a keyless signer's requests, which carry the digest, not the message.
    SignDigest {
        /// The private key.
        key: Arc<SigningKeyPair>,
        /// The scheme; its hash must be the digest's (and for ECDSA, the curve's).
        scheme: SignatureScheme,
        /// The digest, as long as the scheme's hash makes.
        digest: Vec<u8>,
    },
    /// Have a keyless signer elsewhere sign `digest` with a key this process does not
    /// hold. Not batched here: the request goes to [`RemoteKey::sign`] at once, and the
    /// signer batches.
    RemoteSign {
        /// The key, and the signers that hold it.
        key: Arc<dyn RemoteKey>,
        /// The scheme the client and rustls chose.
        scheme: SignatureScheme,
        /// The digest of what rustls asked to sign, by the scheme's hash.
        digest: Vec<u8>,
    },
    /// Generate an ephemeral key pair (TLS 1.2: the ServerKeyExchange share).
    KxGenerate {
        /// The group to generate in.
        group: KxGroup,
    },
    /// Complete an exchange started by [`CryptoOp::KxGenerate`].
    KxAgree {
        /// The group of the private key.
        group: KxGroup,
        /// Our half, from the earlier generation.
        private_key: KxPrivateKey,
        /// The peer's public share as sent on the wire.
        peer_public: Vec<u8>,
    },
    /// Generate a key pair and complete against the peer's share in one go (TLS 1.3).
    KxGenerateAgree {
        /// The group the client's share is in.
        group: KxGroup,
        /// The client's public share as sent on the wire.
        peer_public: Vec<u8>,
    },
}

impl CryptoOp {
    /// The queue this operation goes to.
    pub fn kind(&self) -> OpKind {
        match self {
            CryptoOp::Sign { key, .. } | CryptoOp::SignDigest { key, .. } => {
                match key.algorithm() {
                    crate::KeyAlgorithm::Rsa { .. } => OpKind::RsaSign,
                    crate::KeyAlgorithm::EcdsaP256 | crate::KeyAlgorithm::EcdsaP384 => {
                        OpKind::EcdsaSign
                    }
                }
            }
            CryptoOp::RemoteSign { .. } => OpKind::RemoteSign,
            CryptoOp::KxGenerate { group }
            | CryptoOp::KxAgree { group, .. }
            | CryptoOp::KxGenerateAgree { group, .. } => group.op_kind(),
        }
    }
}

impl fmt::Debug for CryptoOp {
    // Never prints key material or messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CryptoOp::Sign { scheme, .. } => write!(f, "Sign({scheme:?})"),
            CryptoOp::SignDigest { scheme, .. } => write!(f, "SignDigest({scheme:?})"),
            CryptoOp::RemoteSign { scheme, key, .. } => {
                write!(f, "RemoteSign({scheme:?}, {key:?})")
            }
            CryptoOp::KxGenerate { group } => write!(f, "KxGenerate({})", group.name()),
            CryptoOp::KxAgree { group, .. } => write!(f, "KxAgree({})", group.name()),
            CryptoOp::KxGenerateAgree { group, .. } => {
                write!(f, "KxGenerateAgree({})", group.name())
            }
        }
    }
}

/// The result of a [`CryptoOp`], variant for variant.
pub enum CryptoOutput {
    /// A signature, in the scheme's wire encoding.
    Signature(Vec<u8>),
    /// A fresh key pair (for [`CryptoOp::KxGenerate`]).
    KeyPair {
        /// Kept until the peer's share arrives.
        private_key: KxPrivateKey,
        /// Our public share, in wire encoding.
        public: Vec<u8>,
    },
    /// The shared secret (for [`CryptoOp::KxAgree`]).
    Shared(Zeroizing<Vec<u8>>),
    /// Our public share and the shared secret (for [`CryptoOp::KxGenerateAgree`]).
    PublicAndShared {
        /// Our public share, in wire encoding.
        public: Vec<u8>,
        /// The shared secret, zeroized when dropped.
        shared: Zeroizing<Vec<u8>>,
    },
}

impl fmt::Debug for CryptoOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CryptoOutput::Signature(_) => "Signature",
            CryptoOutput::KeyPair { .. } => "KeyPair",
            CryptoOutput::Shared(_) => "Shared",
            CryptoOutput::PublicAndShared { .. } => "PublicAndShared",
        })
    }
}

/// Why an operation produced no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    #[error("signature scheme {0:?} does not fit this key")]
    /// The key cannot sign with the scheme asked for.
    SchemeMismatch(SignatureScheme),
    #[error("signing failed")]
    /// The backend failed to sign.
    SignFailed,
    #[error(
        "signature refused: the handshake was admitted as a resumption and turned out a full one"
    )]
    /// The handshake's first-signature check refused it
    /// ([`crate::HandshakeContext::check_first_signature`]).
    Refused,
    #[error("key generation failed for {0}")]
    /// An ephemeral key could not be generated.
    KeyGenFailed(&'static str),
    #[error("peer's {0} public key is invalid")]
    /// The peer's public share is not a valid point.
    BadPeerKey(&'static str),
    #[error("the {0} crypto backend shut down before answering")]
    /// The backend stopped before answering.
    BackendGone(&'static str),
    #[error("a {0} exchange was completed with a private key of another group")]
    /// [`CryptoOp::KxAgree`] got a private key its group does not make.
    KeyMismatch(&'static str),
    #[error("keyless signer: {0}")]
    /// A remote signature failed: the signers could not be reached, did not answer in
    /// time, or refused.
    Remote(String),
    #[error("the engine answered a {} request with a result of another kind", .0.name())]
    /// The backend answered with another kind of output.
    WrongOutput(OpKind),
}

/// Operation classes: each has its own queue, batch size and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// RSA signatures.
    RsaSign,
    /// ECDSA signatures.
    EcdsaSign,
    /// X25519 key exchange.
    X25519,
    /// P-256 key exchange.
    P256,
    /// P-384 key exchange.
    P384,
    /// X25519MLKEM768 key exchange: its own queue, so that its metrics show how much of
    /// the traffic is post-quantum; its X25519 halves are batched together.
    X25519MlKem768,
    /// Signatures made by a keyless signer elsewhere: never queued here (the signer
    /// batches), counted apart so that a handshake's `remote_sign` time shows.
    RemoteSign,
}

impl OpKind {
    /// How many queues there are.
    pub const COUNT: usize = 7;
    /// Every queue, in index order.
    pub const ALL: [OpKind; Self::COUNT] = [
        OpKind::RsaSign,
        OpKind::EcdsaSign,
        OpKind::X25519,
        OpKind::P256,
        OpKind::P384,
        OpKind::X25519MlKem768,
        OpKind::RemoteSign,
    ];

    /// The queue's index in per-kind arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The queue's name in metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::RsaSign => "rsa_sign",
            OpKind::EcdsaSign => "ecdsa_sign",
            OpKind::X25519 => "x25519",
            OpKind::P256 => "p256",
            OpKind::P384 => "p384",
            OpKind::X25519MlKem768 => "x25519mlkem768",
            OpKind::RemoteSign => "remote_sign",
        }
    }
}
