//! The multi-buffer backend and its arithmetic: safe wrappers over crypto_mb's 8-lane
//! kernels (RSA CRT, ECDSA P-256, X25519), the RSA signature encodings they need, and
//! the [`MultibufferBackend`].

mod backend;
mod der;
pub mod ecdsa;
pub mod emsa;
pub mod rsa;
pub mod x25519;

pub use backend::{MultibufferBackend, ECDSA_CROSSOVER, RSA_CROSSOVER, X25519_CROSSOVER};

/// True when this CPU can run crypto_mb (AVX-512 IFMA and friends).
pub fn applicable() -> bool {
    // SAFETY: a pure CPU-feature query with no pointers.
    unsafe { crypto_mb_sys::mbx_is_crypto_mb_applicable(0) != 0 }
}
