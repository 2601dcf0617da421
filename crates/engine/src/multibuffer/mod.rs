//! The multi-buffer backend's arithmetic: safe wrappers over crypto_mb's 8-lane kernels.

mod der;
pub mod rsa;

/// True when this CPU can run crypto_mb (AVX-512 IFMA and friends).
pub fn applicable() -> bool {
    // SAFETY: a pure CPU-feature query with no pointers.
    unsafe { crypto_mb_sys::mbx_is_crypto_mb_applicable(0) != 0 }
}
