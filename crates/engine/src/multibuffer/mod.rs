//! The multi-buffer backend and its arithmetic: safe wrappers over crypto_mb's 8-lane
//! kernels (RSA CRT, ECDSA and ECDH on P-256/P-384, X25519), the RSA signature encodings
//! they need, and the [`MultibufferBackend`].

mod backend;
mod der;
pub mod ecdh;
pub mod ecdsa;
pub mod emsa;
mod ia32cap;
pub(crate) mod kernel;
pub mod kx;
pub mod nist;
pub mod rsa;
pub mod x25519;

pub use backend::MultibufferBackend;

use std::sync::OnceLock;

/// True when crypto_mb runs here: this CPU has what it needs (AVX-512 IFMA and friends)
/// and `OPENSSL_ia32cap`, the mask aws-lc and OpenSSL honour, does not clear AVX-512 IFMA
/// (see `ia32cap.rs`). The one decision for everyone: `crypto.backend = "auto"`, the
/// refusal of `multibuffer`, `speed` and `capacity`, and which tests run crypto_mb. Decided
/// once per process, as aws-lc reads the variable once.
pub fn applicable() -> bool {
    static APPLICABLE: OnceLock<bool> = OnceLock::new();
    *APPLICABLE.get_or_init(|| {
        let cpu = cpu_runs_crypto_mb();
        let mask = std::env::var("OPENSSL_ia32cap").unwrap_or_default();
        let masked = ia32cap::clears_ifma(&mask);
        if cpu && masked {
            tracing::info!("OPENSSL_ia32cap={mask:?} clears AVX-512 IFMA: crypto_mb is not used, as on a CPU without it");
        }
        cpu && !masked
    })
}

/// crypto_mb's own probe of the CPU.
fn cpu_runs_crypto_mb() -> bool {
    // SAFETY: a pure CPU-feature query with no pointers.
    unsafe { crypto_mb_sys::mbx_is_crypto_mb_applicable(0) != 0 }
}

#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;

/// Lane `i`'s index into the request list: the kernels always compute 8 lanes, so unused
/// and invalid lanes repeat a valid one (`filler`), whose results are then discarded.
fn pick(valid: &[bool], filler: usize, i: usize) -> usize {
    if i < valid.len() && valid[i] {
        i
    } else {
        filler
    }
}
