//! Crypto capacity in the units hardware TLS appliances sell it in. NetScaler's ACU
//! (asymmetric crypto unit) is one RSA-2048 private-key operation per second; its SCU
//! (symmetric crypto unit) is one Mbps of bulk encryption. What one core of this machine
//! has of each with a backend, and what every handshake operation costs in ACU, from the
//! same measurements as `terminus speed`: so that an ECDSA handshake is charged a fraction
//! of an RSA-4096 one, as the CPU sees them.
//!
//! The server measures its own operations at start-up ([`Capacity::quick`]) and charges
//! every crypto request to whoever pays for its handshake ([`terminus_engine::Payer`]) by
//! those figures ([`AcuCosts`]); who may use how much is `terminus-admission`'s business.
//!
//! This crate is the engine's measurement, kept apart from the engine (which is queues
//! and backends): what the machine can do, measured once at start-up or by the CLI.
//!
//! - here: ACU and SCU ([`Capacity`], [`AcuCosts`], [`scu_per_core`]), and each
//!   operation's cost as the multibuffer backend's crossover ([`Capacity::costs`]);
//! - [`speed`]: an operation's throughput on N threads (`terminus speed`);
//! - [`simd`]: what crypto_mb batches cost the scalar work after them on the same core,
//!   and where the batches should run (`crypto.simd`).

pub mod simd;
pub mod speed;

/// Why the machine's crypto could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// A workload to measure could not be made.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// An operation on aws-lc failed.
    #[error("{}: the scalar operation failed", .0.name())]
    Scalar(Operation),
    /// A crypto_mb batch failed.
    #[error("{}: a crypto_mb batch failed", .0.name())]
    Batch(Operation),
    /// RSA-2048, the unit, was not among the workloads.
    #[error("no RSA-2048 measurement: it is the unit")]
    NoUnit,
    /// The measuring thread cannot run where it must.
    #[error("pinning to CPU {cpu}: {source}")]
    Pin {
        /// The CPU.
        cpu: usize,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// The neighbour probe cannot run on its CPU.
    #[error("the neighbour probe cannot run on CPU {cpu}: {source}")]
    NeighbourPin {
        /// The neighbour's CPU.
        cpu: usize,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// The neighbour probe's thread ended before it said whether it was pinned.
    #[error("the neighbour probe did not start")]
    NeighbourNotStarted,
    /// A probe counted no steps.
    #[error("the {}probe counted nothing", if *.neighbour { "neighbour " } else { "" })]
    NothingCounted {
        /// Whether it was the neighbour's probe.
        neighbour: bool,
    },
    /// The measuring thread panicked.
    #[error("the measuring thread panicked")]
    Panicked,
}

use std::time::{Duration, Instant};

use aws_lc_rs::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};

use crate::speed::throughput;
use terminus_engine::cost::{best_time, Cost, Operation, Workload, WorkloadError};
use terminus_engine::{BackendKind, KeyAlgorithm, OpKind};

/// One operation's rates on one core.
#[derive(Clone, Copy, Debug)]
pub struct OpRate {
    /// The operation.
    pub op: Operation,
    /// Computed one by one (aws-lc).
    pub scalar_per_s: f64,
    /// In full 8-lane crypto_mb calls, where the CPU runs them.
    pub batched_per_s: Option<f64>,
}

/// One core's asymmetric capacity with a backend.
#[derive(Clone, Debug)]
pub struct Capacity {
    /// Whether the backend batches (multibuffer): its operations are costed batched.
    pub batched: bool,
    /// Every operation measured, RSA-2048 (the unit) first.
    pub rates: Vec<OpRate>,
}

impl Capacity {
    /// What each operation it timed batched costs, scalar and per 8-lane call, from
    /// which the multibuffer backend's crossovers are set. A hybrid has none of its own:
    /// its batched half's decides.
    pub fn costs(&self) -> Vec<(Operation, Cost)> {
        self.rates
            .iter()
            .filter(|rate| rate.op.decided_by() == rate.op)
            .filter_map(|rate| {
                Some((
                    rate.op,
                    Cost::from_rates(rate.scalar_per_s, rate.batched_per_s?),
                ))
            })
            .collect()
    }

    /// Measures `ops` (RSA-2048 always, first) for `duration` each on one thread, batched
    /// too where `backend` batches.
    pub fn measure(
        backend: BackendKind,
        ops: &[Operation],
        duration: Duration,
    ) -> Result<Self, MeasureError> {
        let batched = backend == BackendKind::Multibuffer;
        let mut wanted = vec![Operation::Rsa2048];
        wanted.extend(ops.iter().filter(|op| **op != Operation::Rsa2048));
        let mut rates = Vec::with_capacity(wanted.len());
        for op in wanted {
            let workload = Workload::generate(op)?;
            rates.push(OpRate {
                op,
                scalar_per_s: throughput(&workload, false, duration, 1),
                batched_per_s: batched.then(|| throughput(&workload, true, duration, 1)),
            });
        }
        Ok(Self { batched, rates })
    }

    /// The start-up measurement: each workload timed the best of a few calls (batched too
    /// where `backend` batches), a few milliseconds each. `workloads` must hold RSA-2048's.
    pub fn quick(backend: BackendKind, workloads: &[&Workload]) -> Result<Self, MeasureError> {
        let batched = backend == BackendKind::Multibuffer;
        let mut rates: Vec<OpRate> = Vec::with_capacity(workloads.len());
        for w in workloads {
            if rates.iter().any(|r| r.op == w.op) {
                continue;
            }
            let scalar = best_time(5, || w.run_scalar()).ok_or(MeasureError::Scalar(w.op))?;
            let batch = batched.then(|| best_time(5, || w.run_batch())).flatten();
            rates.push(OpRate {
                op: w.op,
                scalar_per_s: 1.0 / scalar.as_secs_f64(),
                batched_per_s: batch.map(|b| crypto_mb_sys::LANES as f64 / b.as_secs_f64()),
            });
        }
        let unit = rates
            .iter()
            .position(|r| r.op == Operation::Rsa2048)
            .ok_or(MeasureError::NoUnit)?;
        rates.swap(0, unit);
        Ok(Self { batched, rates })
    }

    /// ACU per core: RSA-2048 private-key operations per second with the backend.
    pub fn acu_per_core(&self) -> f64 {
        self.per_s(&self.rates[0], self.batched)
    }

    /// What one `op` costs in ACU, computed one by one (`batched` false) or in full
    /// batches: the share of a core's second it takes, over an ACU's share.
    pub fn acu_cost(&self, rate: &OpRate, batched: bool) -> Option<f64> {
        if batched && rate.batched_per_s.is_none() {
            return None;
        }
        Some(self.acu_per_core() / self.per_s(rate, batched))
    }

    fn per_s(&self, rate: &OpRate, batched: bool) -> f64 {
        match (batched, rate.batched_per_s) {
            (true, Some(b)) => b,
            _ => rate.scalar_per_s,
        }
    }

    /// What the backend computes `rate.op` at: in full batches where those are cheaper
    /// than one by one (multibuffer computes a batch below its crossover scalar).
    fn best_per_s(&self, rate: &OpRate) -> f64 {
        self.per_s(rate, false).max(self.per_s(rate, self.batched))
    }
}

/// What every operation costs in ACU with the server's backend: the figures quota
/// accounting charges. Measured at start-up; until then (and for an operation no
/// certificate or group of the configuration uses), the ratios of a scalar core.
#[derive(Debug, Clone)]
pub struct AcuCosts {
    /// RSA-2048 operations per second one core computes with the backend.
    pub acu_per_core: f64,
    /// Cores the machine's capacity counts.
    pub cores: usize,
    /// ACU per operation, by [`Operation::ALL`]'s order.
    costs: [f64; Operation::COUNT],
    /// Which costs were measured on this machine.
    measured: [bool; Operation::COUNT],
}

/// ACU costs of a scalar core (aws-lc, one by one): the ratios `terminus capacity`
/// measured alone on an EPYC (bench/README.md), RSA-2048 at 1.
const SCALAR_COSTS: [f64; Operation::COUNT] =
    [1.0, 2.78, 5.61, 0.059, 0.317, 0.125, 0.210, 0.200, 0.190];
/// An RSA-2048 operation on a scalar core, per second: the same EPYC's figure.
const SCALAR_ACU_PER_CORE: f64 = 1500.0;

impl AcuCosts {
    /// The scalar ratios, nothing measured.
    pub fn unmeasured(cores: usize) -> Self {
        Self {
            acu_per_core: SCALAR_ACU_PER_CORE,
            cores,
            costs: SCALAR_COSTS,
            measured: [false; Operation::COUNT],
        }
    }

    /// From a measurement, for a machine of `cores`.
    pub fn from_capacity(capacity: &Capacity, cores: usize) -> Self {
        let mut costs = Self::unmeasured(cores);
        let unit = capacity.best_per_s(&capacity.rates[0]);
        costs.acu_per_core = unit;
        for rate in &capacity.rates {
            let i = Operation::ALL
                .iter()
                .position(|op| *op == rate.op)
                .unwrap_or(0);
            costs.costs[i] = unit / capacity.best_per_s(rate);
            costs.measured[i] = true;
        }
        costs
    }

    /// The machine's ACU: every core's.
    pub fn machine_acu(&self) -> f64 {
        self.acu_per_core * self.cores as f64
    }

    /// What one `op` costs, and whether that was measured here.
    pub fn of(&self, op: Operation) -> (f64, bool) {
        let i = Operation::ALL.iter().position(|o| *o == op).unwrap_or(0);
        (self.costs[i], self.measured[i])
    }

    /// What one engine request costs: `kind`, signed with `key` for signatures.
    pub fn request(&self, kind: OpKind, key: Option<KeyAlgorithm>) -> f64 {
        self.of(operation(kind, key)).0
    }
}

/// The measured operation an engine request is charged as. An RSA key of an unmeasured
/// size is charged as the next size up.
pub fn operation(kind: OpKind, key: Option<KeyAlgorithm>) -> Operation {
    match (kind, key) {
        (_, Some(KeyAlgorithm::Rsa { bits })) if bits <= 2048 => Operation::Rsa2048,
        (_, Some(KeyAlgorithm::Rsa { bits })) if bits <= 3072 => Operation::Rsa3072,
        (_, Some(KeyAlgorithm::Rsa { .. })) => Operation::Rsa4096,
        (_, Some(KeyAlgorithm::EcdsaP256)) => Operation::EcdsaP256,
        (_, Some(KeyAlgorithm::EcdsaP384)) => Operation::EcdsaP384,
        // A remote signature is charged as the signature it is (with its key it is
        // matched above): a tenant's quota counts handshakes, wherever they sign.
        (OpKind::RsaSign | OpKind::RemoteSign, None) => Operation::Rsa2048,
        (OpKind::EcdsaSign, None) => Operation::EcdsaP256,
        (OpKind::X25519, None) => Operation::X25519,
        (OpKind::P256, None) => Operation::EcdhP256,
        (OpKind::P384, None) => Operation::EcdhP384,
        (OpKind::X25519MlKem768, None) => Operation::X25519MlKem768,
    }
}

/// The record ciphers terminus negotiates, for SCU.
pub const CIPHERS: [(&str, &aead::Algorithm); 3] = [
    ("aes128gcm", &aead::AES_128_GCM),
    ("aes256gcm", &aead::AES_256_GCM),
    ("chacha20poly1305", &aead::CHACHA20_POLY1305),
];

/// SCU per core with `cipher`: Mbps of 16 KiB records (TLS's largest) sealed on one core
/// for `duration`, the tags included in the work but not in the bytes.
pub fn scu_per_core(cipher: &'static aead::Algorithm, duration: Duration) -> f64 {
    const RECORD: usize = 16 * 1024;
    let key_bytes = vec![0x5a; cipher.key_len()];
    let key = LessSafeKey::new(UnboundKey::new(cipher, &key_bytes).expect("a key of its length"));
    let mut record = vec![0u8; RECORD];
    let start = Instant::now();
    let mut sealed = 0u64;
    // The nonce of a TLS record: a sequence number, never repeated under this key.
    let mut seq = 0u64;
    while start.elapsed() < duration {
        let mut nonce = [0u8; aead::NONCE_LEN];
        nonce[4..].copy_from_slice(&seq.to_be_bytes());
        seq += 1;
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from([23, 3, 3, 0x40, 0x11]),
                &mut record,
            )
            .expect("sealing a record");
        let _ = std::hint::black_box(tag);
        sealed += RECORD as u64;
    }
    sealed as f64 * 8.0 / 1e6 / start.elapsed().as_secs_f64()
}
