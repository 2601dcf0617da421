//! Raw FFI to Intel's crypto_mb: 8-lane (AVX-512 IFMA) RSA, ECDSA and ECDH.
//!
//! Only the raw-limb entry points are declared, never the `_ssl_` ones that take OpenSSL
//! BIGNUMs. Conventions (checked against OpenSSL in this crate's tests):
//! - byte strings (RSA input/output, X25519 keys, shared secrets) are per-lane buffers;
//! - big numbers passed as `int64u*` are little-endian 64-bit limbs;
//! - every function returns an `mbx_status` with 4 status bits per lane ([`lane_status`]).
//!
//! Each declaration is the header's prototype spelled in Rust (`int8u* a[8]` is
//! `*mut *mut int8u`, `int8u* const a[8]` is `*const *mut int8u`); `tests/abi.rs` has a C
//! compiler check them against crypto_mb's headers.
#![allow(non_camel_case_types)]
// The FFI boundary: the declarations of crypto_mb's C functions.
#![allow(unsafe_code)]
// Each item is a prototype or type of crypto_mb's C headers, documented there.
#![allow(missing_docs)]

use std::os::raw::c_int;

pub type int8u = u8;
pub type int64u = u64;
pub type mbx_status = u32;

pub const LANES: usize = 8;
pub const MBX_STATUS_OK: u32 = 0;
pub const MBX_STATUS_MISMATCH_PARAM_ERR: u32 = 1;
pub const MBX_STATUS_NULL_PARAM_ERR: u32 = 2;
pub const MBX_STATUS_LOW_ORDER_ERR: u32 = 4;
pub const MBX_STATUS_SIGNATURE_ERR: u32 = 8;

/// The status nibble of `lane`.
pub fn lane_status(status: mbx_status, lane: usize) -> u32 {
    (status >> (4 * (lane & 7))) & 0xF
}

/// Opaque RSA method descriptor.
#[repr(C)]
pub struct mbx_RSA_Method {
    _private: [u8; 0],
}

extern "C" {
    /// Non-zero when this CPU has what crypto_mb needs (AVX-512 IFMA); 0 for "detect".
    pub fn mbx_is_crypto_mb_applicable(cpu_features: int64u) -> c_int;

    pub fn mbx_x25519_public_key_mb8(
        pa_public_key: *const *mut int8u,
        pa_private_key: *const *const int8u,
    ) -> mbx_status;

    pub fn mbx_x25519_mb8(
        pa_shared_key: *const *mut int8u,
        pa_private_key: *const *const int8u,
        pa_public_key: *const *const int8u,
    ) -> mbx_status;

    pub fn mbx_RSA_private_crt_Method(rsa_bitsize: c_int) -> *const mbx_RSA_Method;
    pub fn mbx_RSA_pub65537_Method(rsa_bitsize: c_int) -> *const mbx_RSA_Method;
    pub fn mbx_RSA_Method_BufSize(m: *const mbx_RSA_Method) -> c_int;

    pub fn mbx_rsa_private_crt_mb8(
        from_pa: *const *const int8u,
        to_pa: *const *mut int8u,
        p_pa: *const *const int64u,
        q_pa: *const *const int64u,
        dp_pa: *const *const int64u,
        dq_pa: *const *const int64u,
        iq_pa: *const *const int64u,
        rsa_bitlen: c_int,
        m: *const mbx_RSA_Method,
        p_buffer: *mut int8u,
    ) -> mbx_status;

    pub fn mbx_rsa_public_mb8(
        from_pa: *const *const int8u,
        to_pa: *const *mut int8u,
        n_pa: *const *const int64u,
        rsa_bitlen: c_int,
        m: *const mbx_RSA_Method,
        p_buffer: *mut int8u,
    ) -> mbx_status;
}

extern "C" {
    /// ECDSA P-384 signatures: as [`mbx_nistp256_ecdsa_sign_mb8`] with 48-byte digests and
    /// outputs and 6-limb keys.
    pub fn mbx_nistp384_ecdsa_sign_mb8(
        pa_sign_r: *mut *mut int8u,
        pa_sign_s: *mut *mut int8u,
        pa_msg: *const *const int8u,
        pa_eph_skey: *const *const int64u,
        pa_reg_skey: *const *const int64u,
        p_buffer: *mut int8u,
    ) -> mbx_status;

    /// Public keys of P-256 private keys (4 limbs each). With `pa_pubz` null the outputs
    /// are affine x and y (4 limbs each); otherwise Jacobian X:Y:Z.
    pub fn mbx_nistp256_ecpublic_key_mb8(
        pa_pubx: *mut *mut int64u,
        pa_puby: *mut *mut int64u,
        pa_pubz: *mut *mut int64u,
        pa_skey: *const *const int64u,
        p_buffer: *mut int8u,
    ) -> mbx_status;

    /// P-256 ECDH: the affine x coordinate of [skey]·peer as 32 big-endian bytes. With
    /// `pa_pubz` null the peer points are affine; a point off the curve fails its lane.
    pub fn mbx_nistp256_ecdh_mb8(
        pa_shared_key: *mut *mut int8u,
        pa_skey: *const *const int64u,
        pa_pubx: *const *const int64u,
        pa_puby: *const *const int64u,
        pa_pubz: *const *const int64u,
        p_buffer: *mut int8u,
    ) -> mbx_status;

    /// As [`mbx_nistp256_ecpublic_key_mb8`] for P-384 (6 limbs).
    pub fn mbx_nistp384_ecpublic_key_mb8(
        pa_pubx: *mut *mut int64u,
        pa_puby: *mut *mut int64u,
        pa_pubz: *mut *mut int64u,
        pa_skey: *const *const int64u,
        p_buffer: *mut int8u,
    ) -> mbx_status;

    /// As [`mbx_nistp256_ecdh_mb8`] for P-384 (6 limbs, 48-byte secrets).
    pub fn mbx_nistp384_ecdh_mb8(
        pa_shared_key: *mut *mut int8u,
        pa_skey: *const *const int64u,
        pa_pubx: *const *const int64u,
        pa_puby: *const *const int64u,
        pa_pubz: *const *const int64u,
        p_buffer: *mut int8u,
    ) -> mbx_status;

    /// ECDSA P-256 signatures. `pa_msg`: 32-byte digests; keys: 4 little-endian limbs;
    /// `pa_sign_r`/`pa_sign_s`: 32-byte outputs. `p_buffer` is unused by the library.
    pub fn mbx_nistp256_ecdsa_sign_mb8(
        pa_sign_r: *mut *mut int8u,
        pa_sign_s: *mut *mut int8u,
        pa_msg: *const *const int8u,
        pa_eph_skey: *const *const int64u,
        pa_reg_skey: *const *const int64u,
        p_buffer: *mut int8u,
    ) -> mbx_status;
}
