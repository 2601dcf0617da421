//! The multi-buffer backend and its arithmetic: safe wrappers over crypto_mb's 8-lane
//! kernels (RSA CRT, ECDSA and ECDH on P-256/P-384, X25519), the RSA signature encodings
//! they need, and the [`MultibufferBackend`].

mod backend;
mod der;
pub mod ecdh;
pub mod ecdsa;
pub mod emsa;
pub(crate) mod kernel;
pub mod kx;
pub mod nist;
pub mod rsa;
pub mod x25519;

pub use backend::MultibufferBackend;

/// True when this CPU can run crypto_mb (AVX-512 IFMA and friends).
pub fn applicable() -> bool {
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
