//! Crypto capacity in the units hardware TLS appliances sell it in. NetScaler's ACU
//! (asymmetric crypto unit) is one RSA-2048 private-key operation per second; its SCU
//! (symmetric crypto unit) is one Mbps of bulk encryption. What one core of this machine
//! has of each with a backend, and what every handshake operation costs in ACU, from the
//! same measurements as `terminus speed`: so that an ECDSA handshake is charged a fraction
//! of an RSA-4096 one, as the CPU sees them.

use std::time::{Duration, Instant};

use aws_lc_rs::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};

use crate::cost::{Operation, Workload};
use crate::speed::throughput;
use crate::BackendKind;

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
    /// Measures `ops` (RSA-2048 always, first) for `duration` each on one thread, batched
    /// too where `backend` batches.
    pub fn measure(
        backend: BackendKind,
        ops: &[Operation],
        duration: Duration,
    ) -> Result<Self, String> {
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
