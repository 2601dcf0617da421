//! What each batchable operation costs on this CPU, computed scalar (aws-lc) and as one
//! full 8-lane crypto_mb call, and the crossover batch sizes the multibuffer backend
//! decides by ([`Crossovers`], measured at start-up by `terminus-capacity`; `terminus
//! speed` prints the same). [`Workload`] runs one operation scalar or one 8-lane call:
//! the unit every measurement times.
//!
//! A crossover is the smallest batch for which one mb8 call costs no more than computing
//! its requests one by one: `ceil(batch call time / scalar time)`. An mb8 call costs the
//! same whatever its lane count, so below the crossover the backend runs scalar.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rsa::{KeyPair as RsaKeyPair, KeySize};
use aws_lc_rs::signature::{
    EcdsaKeyPair, EcdsaSigningAlgorithm, ECDSA_P256_SHA256_ASN1_SIGNING,
    ECDSA_P384_SHA384_ASN1_SIGNING,
};
use rustls::SignatureScheme;
use terminus_metrics::{Exposition, Kind, Labels, Render};

use crate::multibuffer::emsa::Encoding;
use crate::multibuffer::kernel::CryptoMb;
use crate::multibuffer::{ecdsa, kx, rsa};
use crate::op::{CryptoOp, CryptoOutput, KxGroup};
use crate::scalar;
use crate::signing_key::KeyError;
use crate::signing_key::{BatchKey, KeyAlgorithm, SigningKeyPair};
use crypto_mb_sys::LANES;

/// The operations crypto_mb batches, as `terminus speed` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    /// RSA-2048 private-key operation (a PSS or PKCS#1 v1.5 signature).
    Rsa2048,
    /// RSA-3072 private-key operation.
    Rsa3072,
    /// RSA-4096 private-key operation.
    Rsa4096,
    /// ECDSA P-256 signature.
    EcdsaP256,
    /// ECDSA P-384 signature.
    EcdsaP384,
    /// X25519 key generation and agreement.
    X25519,
    /// ECDH P-256 key generation and agreement.
    EcdhP256,
    /// ECDH P-384 key generation and agreement.
    EcdhP384,
    /// X25519MLKEM768 as a server computes it: an ML-KEM-768 encapsulation (never
    /// batched) and an X25519 key pair and secret (batched). Its batches are decided by
    /// X25519's crossover ([`Operation::decided_by`]).
    X25519MlKem768,
}

impl Operation {
    /// How many operations there are.
    pub const COUNT: usize = 9;
    /// Every operation, in table order.
    pub const ALL: [Operation; Self::COUNT] = [
        Operation::Rsa2048,
        Operation::Rsa3072,
        Operation::Rsa4096,
        Operation::EcdsaP256,
        Operation::EcdsaP384,
        Operation::X25519,
        Operation::EcdhP256,
        Operation::EcdhP384,
        Operation::X25519MlKem768,
    ];

    /// The name `terminus speed` prints and accepts.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Rsa2048 => "rsa2048",
            Operation::Rsa3072 => "rsa3072",
            Operation::Rsa4096 => "rsa4096",
            Operation::EcdsaP256 => "ecdsap256",
            Operation::EcdsaP384 => "ecdsap384",
            Operation::X25519 => "x25519",
            Operation::EcdhP256 => "ecdhp256",
            Operation::EcdhP384 => "ecdhp384",
            Operation::X25519MlKem768 => "x25519mlkem768",
        }
    }

    /// What one operation is, for people reading `terminus speed`.
    pub fn describe(self) -> &'static str {
        match self {
            Operation::Rsa2048 | Operation::Rsa3072 | Operation::Rsa4096 => {
                "RSA-PSS-SHA256 signature"
            }
            Operation::EcdsaP256 => "ECDSA-SHA256 signature",
            Operation::EcdsaP384 => "ECDSA-SHA384 signature",
            Operation::X25519 | Operation::EcdhP256 | Operation::EcdhP384 => {
                "key pair + shared secret"
            }
            Operation::X25519MlKem768 => "ML-KEM encaps + X25519",
        }
    }

    /// The operation whose crossover decides this one's batches: itself, or for a hybrid
    /// its batched half. A hybrid batch of n costs n KEM operations either way, so it pays
    /// exactly when n X25519 operations do.
    pub fn decided_by(self) -> Self {
        match self {
            Operation::X25519MlKem768 => Operation::X25519,
            op => op,
        }
    }

    /// The operation [`Operation::name`] gives `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|op| op.name().eq_ignore_ascii_case(name))
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The operation a batched signature with `key` is, if the kernels take the key.
    pub fn for_key(key: &SigningKeyPair) -> Option<Self> {
        key.batch_key()?;
        match key.algorithm() {
            KeyAlgorithm::Rsa { bits: 2048 } => Some(Operation::Rsa2048),
            KeyAlgorithm::Rsa { bits: 3072 } => Some(Operation::Rsa3072),
            KeyAlgorithm::Rsa { bits: 4096 } => Some(Operation::Rsa4096),
            KeyAlgorithm::Rsa { .. } => None,
            KeyAlgorithm::EcdsaP256 => Some(Operation::EcdsaP256),
            KeyAlgorithm::EcdsaP384 => Some(Operation::EcdsaP384),
        }
    }

    /// The key exchange of `group`.
    pub fn for_group(group: KxGroup) -> Self {
        match group {
            KxGroup::X25519 => Operation::X25519,
            KxGroup::Secp256r1 => Operation::EcdhP256,
            KxGroup::Secp384r1 => Operation::EcdhP384,
            KxGroup::X25519MlKem768 => Operation::X25519MlKem768,
        }
    }

    /// The crossover used until one is measured: what `terminus speed` measured on the
    /// development machines (AMD EPYC with AVX-512 IFMA, bench/README.md).
    fn default_crossover(self) -> usize {
        match self {
            Operation::Rsa2048 => 3,
            Operation::Rsa3072 => 7,
            Operation::Rsa4096 => 5,
            Operation::EcdsaP256 => 3,
            Operation::EcdsaP384 => 2,
            Operation::X25519 | Operation::EcdhP256 | Operation::EcdhP384 => 3,
            Operation::X25519MlKem768 => Operation::X25519.default_crossover(),
        }
    }
}

/// The inputs to time one operation with: a signing key, or a key-exchange group and a
/// peer's public key.
pub struct Workload {
    /// The operation timed.
    pub op: Operation,
    input: Input,
}

enum Input {
    Sign {
        key: Arc<SigningKeyPair>,
        scheme: SignatureScheme,
    },
    Kx {
        group: KxGroup,
        peer_public: Vec<u8>,
    },
}

/// As long as what a TLS 1.3 server signs: 64 spaces, the 33-byte context string, a zero
/// byte and a SHA-256 transcript hash.
const MESSAGE: &[u8] = &[0x20; 130];

/// Why a workload could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
    /// aws-lc did not make a key (or its encoding).
    #[error("{}: cannot generate {what}", op.name())]
    Generate {
        /// The operation it was for.
        op: Operation,
        /// What could not be made.
        what: &'static str,
    },
    /// The key made does not load.
    #[error("{}: {source}", op.name())]
    Key {
        /// The operation it was for.
        op: Operation,
        /// What loading it said.
        #[source]
        source: KeyError,
    },
    /// No peer key for a key exchange.
    #[error("{}: cannot make a peer key", group.name())]
    PeerKey {
        /// The group.
        group: KxGroup,
    },
}

impl Workload {
    /// A workload signing with `key` (a certificate's key), if the kernels take it.
    pub fn for_key(key: Arc<SigningKeyPair>) -> Option<Self> {
        let op = Operation::for_key(&key)?;
        // The first scheme is what TLS 1.3 uses: RSA-PSS-SHA256, or the curve's ECDSA.
        let scheme = key.algorithm().schemes()[0];
        Some(Self {
            op,
            input: Input::Sign { key, scheme },
        })
    }

    /// A workload for `op` with freshly generated keys (RSA key generation takes a while).
    pub fn generate(op: Operation) -> Result<Self, WorkloadError> {
        let failed = |what: &'static str| WorkloadError::Generate { op, what };
        let rsa = |size: KeySize| -> Result<Vec<u8>, WorkloadError> {
            let pair = RsaKeyPair::generate(size).map_err(|_| failed("an RSA key"))?;
            let der = AsDer::<aws_lc_rs::encoding::Pkcs8V1Der>::as_der(&pair)
                .map_err(|_| failed("the RSA key's PKCS#8"))?;
            Ok(der.as_ref().to_vec())
        };
        let ec = |alg: &'static EcdsaSigningAlgorithm| -> Result<Vec<u8>, WorkloadError> {
            let pair = EcdsaKeyPair::generate(alg).map_err(|_| failed("an ECDSA key"))?;
            let der = pair
                .to_pkcs8v1()
                .map_err(|_| failed("the ECDSA key's PKCS#8"))?;
            Ok(der.as_ref().to_vec())
        };
        let der = match op {
            Operation::Rsa2048 => rsa(KeySize::Rsa2048)?,
            Operation::Rsa3072 => rsa(KeySize::Rsa3072)?,
            Operation::Rsa4096 => rsa(KeySize::Rsa4096)?,
            Operation::EcdsaP256 => ec(&ECDSA_P256_SHA256_ASN1_SIGNING)?,
            Operation::EcdsaP384 => ec(&ECDSA_P384_SHA384_ASN1_SIGNING)?,
            Operation::X25519 => return Self::for_group(KxGroup::X25519),
            Operation::EcdhP256 => return Self::for_group(KxGroup::Secp256r1),
            Operation::EcdhP384 => return Self::for_group(KxGroup::Secp384r1),
            Operation::X25519MlKem768 => return Self::for_group(KxGroup::X25519MlKem768),
        };
        let key =
            SigningKeyPair::from_der(&der).map_err(|source| WorkloadError::Key { op, source })?;
        Self::for_key(Arc::new(key)).ok_or_else(|| failed("a key crypto_mb takes"))
    }

    /// A workload for the key exchange of `group` against a fresh peer key (made by aws-lc,
    /// so that scalar figures can be taken on a CPU crypto_mb cannot run on).
    pub fn for_group(group: KxGroup) -> Result<Self, WorkloadError> {
        let peer_public = match scalar::compute(CryptoOp::KxGenerate { group }) {
            Ok(CryptoOutput::KeyPair { public, .. }) => public,
            _ => return Err(WorkloadError::PeerKey { group }),
        };
        Ok(Self {
            op: Operation::for_group(group),
            input: Input::Kx { group, peer_public },
        })
    }

    /// One operation on aws-lc. False if it failed.
    pub fn run_scalar(&self) -> bool {
        let op = match &self.input {
            Input::Sign { key, scheme } => CryptoOp::Sign {
                key: key.clone(),
                scheme: *scheme,
                message: MESSAGE.to_vec(),
            },
            Input::Kx { group, peer_public } => CryptoOp::KxGenerateAgree {
                group: *group,
                peer_public: peer_public.clone(),
            },
        };
        scalar::compute(op).is_ok()
    }

    /// Eight operations in one crypto_mb call (two for a key exchange: public keys, then
    /// secrets), with everything the backend does around it (encoding, the RSA result
    /// check, fresh nonces and keys, a hybrid's KEM parts). False if any lane failed.
    pub fn run_batch(&self) -> bool {
        match &self.input {
            Input::Sign { key, scheme } => match key.batch_key() {
                Some(BatchKey::Rsa(k)) => {
                    let Some(encoding) = Encoding::for_scheme(*scheme) else {
                        return false;
                    };
                    let Some(encoded) = (0..LANES)
                        .map(|_| encoding.encode(MESSAGE, k.bits()))
                        .collect::<Option<Vec<_>>>()
                    else {
                        return false;
                    };
                    let lanes: Vec<_> = encoded.iter().map(|m| (k, m.as_slice())).collect();
                    rsa::private_crt(k.bits(), &lanes).iter().all(Result::is_ok)
                }
                Some(BatchKey::Ecdsa(k)) => {
                    let lanes: Vec<_> = (0..LANES).map(|_| (k, MESSAGE)).collect();
                    ecdsa::sign(&lanes).iter().all(Result::is_ok)
                }
                None => false,
            },
            Input::Kx { group, peer_public } => {
                let ops = (0..LANES)
                    .map(|_| CryptoOp::KxGenerateAgree {
                        group: *group,
                        peer_public: peer_public.clone(),
                    })
                    .collect();
                let results = kx::compute_on(&CryptoMb, *group, ops).results;
                results.iter().all(Result::is_ok)
            }
        }
    }
}

/// The cheapest of `samples` timed calls of `f`, after one untimed warm-up call: the
/// minimum is what the CPU can do, free of preemption and throttling noise.
pub fn best_time(samples: usize, f: impl Fn() -> bool) -> Option<Duration> {
    if !f() {
        return None;
    }
    (0..samples)
        .map(|_| {
            let start = Instant::now();
            f().then(|| start.elapsed())
        })
        .collect::<Option<Vec<_>>>()?
        .into_iter()
        .min()
}

/// What one operation costs, scalar and per 8-lane call.
#[derive(Clone, Copy, Debug)]
pub struct Cost {
    /// One operation computed alone.
    pub scalar: Duration,
    /// One 8-lane call, all lanes full.
    pub batch: Duration,
}

impl Cost {
    /// From throughputs: operations per second one by one and in full 8-lane calls.
    pub fn from_rates(scalar_per_s: f64, batched_per_s: f64) -> Self {
        Self {
            scalar: Duration::from_secs_f64(1.0 / scalar_per_s),
            batch: Duration::from_secs_f64(LANES as f64 / batched_per_s),
        }
    }

    /// The smallest batch worth an mb8 call; `LANES + 1` when none is.
    pub fn crossover(&self) -> usize {
        let ratio = self.batch.as_secs_f64() / self.scalar.as_secs_f64().max(1e-9);
        (ratio.ceil() as usize).clamp(1, LANES + 1)
    }
}

/// A crossover as people read it: "never" when no batch is worth a call.
pub fn crossover_label(crossover: usize) -> String {
    if crossover > LANES {
        "never".to_owned()
    } else {
        crossover.to_string()
    }
}

/// The crossover of every operation: measured on this CPU where [`Crossovers::set_from`]
/// was given a measurement, a default otherwise. Shared by all workers.
#[derive(Debug)]
pub struct Crossovers {
    /// 0 until measured.
    measured: [AtomicUsize; Operation::COUNT],
}

impl Default for Crossovers {
    fn default() -> Self {
        Self {
            measured: std::array::from_fn(|_| AtomicUsize::new(0)),
        }
    }
}

impl Crossovers {
    /// The smallest batch of `op` the multibuffer backend computes in one call.
    pub fn get(&self, op: Operation) -> usize {
        let op = op.decided_by();
        match self.measured[op.index()].load(Ordering::Relaxed) {
            0 => op.default_crossover(),
            n => n,
        }
    }

    /// Fixes the crossover of `op` to `batch` (clamped to 1..=9), as if measured.
    pub fn set(&self, op: Operation, batch: usize) {
        self.measured[op.decided_by().index()].store(batch.clamp(1, LANES + 1), Ordering::Relaxed);
    }

    /// Whether `op` was timed (an operation no key or group uses is not).
    pub fn is_measured(&self, op: Operation) -> bool {
        self.measured[op.decided_by().index()].load(Ordering::Relaxed) != 0
    }

    /// (operation, crossover, measured?) for every operation with a crossover of its own.
    pub fn all(&self) -> impl Iterator<Item = (Operation, usize, bool)> + '_ {
        Operation::ALL
            .into_iter()
            .filter(|op| op.decided_by() == *op)
            .map(|op| (op, self.get(op), self.is_measured(op)))
    }
}

impl Render for Crossovers {
    fn render(&self, out: &mut Exposition) {
        const NAME: &str = "terminus_crypto_crossover";
        out.header(NAME, Kind::Gauge, "Smallest batch the multibuffer backend computes in one call (9: never); measured=\"1\" when measured on this CPU at start-up.");
        for (op, crossover, measured) in self.all() {
            let labels = Labels::NONE
                .with("op", op.name())
                .with("measured", u8::from(measured));
            out.sample(NAME, &labels, crossover);
        }
    }
}
