//! The seam between the lane bookkeeping and crypto_mb: its 8-lane kernels in safe form.
//!
//! Everything around a kernel call (checking inputs, filling unused lanes, mapping each
//! lane's status and output back to its request, verifying RSA results before release,
//! drawing nonces) is written against [`Kernels`]. [`CryptoMb`] is the one implementation
//! that calls the library, and the only place that builds its pointer arrays; the tests
//! drive the same bookkeeping on any CPU through an independent reference implementation
//! (`reference.rs`), so none of it goes untested where AVX-512 IFMA is missing.

use std::os::raw::c_int;

use crypto_mb_sys::{self as mb, mbx_status, LANES};
use zeroize::Zeroizing;

use super::nist::Curve;
use super::rsa::RsaCrtKey;

/// One value per lane.
pub type Lanes<T> = [T; LANES];

/// The batched operations, 8 lanes per call. Every lane is computed (callers fill unused
/// lanes with a valid lane's inputs); the status holds 4 bits per lane
/// ([`mb::lane_status`]). Byte strings are big-endian, limbs little-endian `u64`s,
/// as crypto_mb takes them.
pub trait Kernels {
    /// `to[i] = from[i]^d mod n` with `keys[i]`'s CRT components; `bits / 8` bytes each.
    fn rsa_private_crt(
        &self,
        bits: usize,
        keys: Lanes<&RsaCrtKey>,
        from: Lanes<&[u8]>,
        to: Lanes<&mut [u8]>,
    ) -> mbx_status;

    /// `to[i] = from[i]^65537 mod n[i]`; `bits / 8` bytes each.
    fn rsa_public_65537(
        &self,
        bits: usize,
        n: Lanes<&[u64]>,
        from: Lanes<&[u8]>,
        to: Lanes<&mut [u8]>,
    ) -> mbx_status;

    /// X25519 public keys of 32-byte private keys.
    fn x25519_public_key(&self, private: Lanes<&[u8]>, to: Lanes<&mut [u8]>) -> mbx_status;

    /// X25519 shared secrets (all-zero for a low-order peer; crypto_mb does not flag it).
    fn x25519(&self, private: Lanes<&[u8]>, peer: Lanes<&[u8]>, to: Lanes<&mut [u8]>)
        -> mbx_status;

    /// Affine public points `[private[i]]G` on `curve`.
    fn ec_public_key(
        &self,
        curve: Curve,
        private: Lanes<&[u64]>,
        x: Lanes<&mut [u64]>,
        y: Lanes<&mut [u64]>,
    ) -> mbx_status;

    /// The x coordinate of `[private[i]](peer_x[i], peer_y[i])`; a peer point off the
    /// curve fails its lane.
    fn ecdh(
        &self,
        curve: Curve,
        private: Lanes<&[u64]>,
        peer_x: Lanes<&[u64]>,
        peer_y: Lanes<&[u64]>,
        to: Lanes<&mut [u8]>,
    ) -> mbx_status;

    /// ECDSA signatures (r, s) of `digest[i]` with `key[i]` and nonce `nonce[i]`.
    fn ecdsa_sign(
        &self,
        curve: Curve,
        digest: Lanes<&[u8]>,
        nonce: Lanes<&[u64]>,
        key: Lanes<&[u64]>,
        r: Lanes<&mut [u8]>,
        s: Lanes<&mut [u8]>,
    ) -> mbx_status;
}

/// `buf` as 8 lanes of `len` elements.
pub fn split_lanes<T>(buf: &mut [T], len: usize) -> Lanes<&mut [T]> {
    assert_eq!(buf.len(), LANES * len, "8 lanes of {len}");
    let mut lanes = buf.chunks_exact_mut(len);
    std::array::from_fn(|_| lanes.next().expect("8 lanes"))
}

/// `buf` as 8 read-only lanes of `len` elements.
pub fn lanes_of<T>(buf: &[T], len: usize) -> Lanes<&[T]> {
    assert_eq!(buf.len(), LANES * len, "8 lanes of {len}");
    std::array::from_fn(|i| &buf[i * len..(i + 1) * len])
}

/// A status failing every lane with `code`.
fn all_lanes(code: u32) -> mbx_status {
    (0..LANES).fold(0, |s, i| s | code << (4 * i))
}

fn check_lens<T>(lanes: &[&[T]], len: usize) {
    assert!(
        lanes.iter().all(|l| l.len() == len),
        "every lane holds {len}"
    );
}

fn check_lens_mut<T>(lanes: &[&mut [T]], len: usize) {
    assert!(
        lanes.iter().all(|l| l.len() == len),
        "every lane holds {len}"
    );
}

fn ptrs<T>(lanes: &Lanes<&[T]>) -> Lanes<*const T> {
    std::array::from_fn(|i| lanes[i].as_ptr())
}

fn ptrs_mut<T>(lanes: &mut Lanes<&mut [T]>) -> Lanes<*mut T> {
    let mut it = lanes.iter_mut();
    std::array::from_fn(|_| it.next().expect("8 lanes").as_mut_ptr())
}

/// Intel's crypto_mb (AVX-512 IFMA). Construct it only where
/// [`super::applicable`] is true: its kernels fault on other CPUs.
pub struct CryptoMb;

impl Kernels for CryptoMb {
    fn rsa_private_crt(
        &self,
        bits: usize,
        keys: Lanes<&RsaCrtKey>,
        from: Lanes<&[u8]>,
        mut to: Lanes<&mut [u8]>,
    ) -> mbx_status {
        let half = bits / 128;
        check_lens(&from, bits / 8);
        check_lens_mut(&to, bits / 8);
        let limbs = |f: fn(&RsaCrtKey) -> &[u64]| -> Lanes<*const u64> {
            std::array::from_fn(|i| {
                let l = f(keys[i]);
                assert_eq!(l.len(), half, "CRT components of {bits}-bit keys");
                l.as_ptr()
            })
        };
        let (p, q, dp, dq, qinv) = (
            limbs(RsaCrtKey::p),
            limbs(RsaCrtKey::q),
            limbs(RsaCrtKey::dp),
            limbs(RsaCrtKey::dq),
            limbs(RsaCrtKey::qinv),
        );
        let (from, to) = (ptrs(&from), ptrs_mut(&mut to));
        // SAFETY: 8 pointers each to inputs and outputs of `bits / 8` bytes and to CRT
        // components of `bits / 128` limbs (all asserted above), the lengths crypto_mb
        // reads and writes for `bits`; the scratch buffer has the size the method asks
        // for. Nothing is retained after the call.
        unsafe {
            let method = mb::mbx_RSA_private_crt_Method(bits as c_int);
            if method.is_null() {
                return all_lanes(mb::MBX_STATUS_MISMATCH_PARAM_ERR);
            }
            let size = mb::mbx_RSA_Method_BufSize(method).max(0) as usize;
            let mut scratch = Zeroizing::new(vec![0u8; size]);
            mb::mbx_rsa_private_crt_mb8(
                from.as_ptr(),
                to.as_ptr(),
                p.as_ptr(),
                q.as_ptr(),
                dp.as_ptr(),
                dq.as_ptr(),
                qinv.as_ptr(),
                bits as c_int,
                method,
                scratch.as_mut_ptr(),
            )
        }
    }

    fn rsa_public_65537(
        &self,
        bits: usize,
        n: Lanes<&[u64]>,
        from: Lanes<&[u8]>,
        mut to: Lanes<&mut [u8]>,
    ) -> mbx_status {
        check_lens(&n, bits / 64);
        check_lens(&from, bits / 8);
        check_lens_mut(&to, bits / 8);
        let (n, from, to) = (ptrs(&n), ptrs(&from), ptrs_mut(&mut to));
        // SAFETY: 8 pointers each to moduli of `bits / 64` limbs and to inputs and
        // outputs of `bits / 8` bytes (asserted above); scratch as the method asks.
        unsafe {
            let method = mb::mbx_RSA_pub65537_Method(bits as c_int);
            if method.is_null() {
                return all_lanes(mb::MBX_STATUS_MISMATCH_PARAM_ERR);
            }
            let size = mb::mbx_RSA_Method_BufSize(method).max(0) as usize;
            let mut scratch = vec![0u8; size];
            mb::mbx_rsa_public_mb8(
                from.as_ptr(),
                to.as_ptr(),
                n.as_ptr(),
                bits as c_int,
                method,
                scratch.as_mut_ptr(),
            )
        }
    }

    fn x25519_public_key(&self, private: Lanes<&[u8]>, mut to: Lanes<&mut [u8]>) -> mbx_status {
        check_lens(&private, 32);
        check_lens_mut(&to, 32);
        let (private, to) = (ptrs(&private), ptrs_mut(&mut to));
        // SAFETY: 8 pointers each to 32-byte private keys and 32-byte outputs (asserted
        // above); crypto_mb reads and writes exactly that and keeps nothing.
        unsafe { mb::mbx_x25519_public_key_mb8(to.as_ptr(), private.as_ptr()) }
    }

    fn x25519(
        &self,
        private: Lanes<&[u8]>,
        peer: Lanes<&[u8]>,
        mut to: Lanes<&mut [u8]>,
    ) -> mbx_status {
        check_lens(&private, 32);
        check_lens(&peer, 32);
        check_lens_mut(&to, 32);
        let (private, peer, to) = (ptrs(&private), ptrs(&peer), ptrs_mut(&mut to));
        // SAFETY: 8 pointers each to 32-byte private keys, peer keys and outputs
        // (asserted above); nothing is retained.
        unsafe { mb::mbx_x25519_mb8(to.as_ptr(), private.as_ptr(), peer.as_ptr()) }
    }

    fn ec_public_key(
        &self,
        curve: Curve,
        private: Lanes<&[u64]>,
        mut x: Lanes<&mut [u64]>,
        mut y: Lanes<&mut [u64]>,
    ) -> mbx_status {
        let limbs = curve.limbs();
        check_lens(&private, limbs);
        check_lens_mut(&x, limbs);
        check_lens_mut(&y, limbs);
        let private = ptrs(&private);
        let (mut x, mut y) = (ptrs_mut(&mut x), ptrs_mut(&mut y));
        let public_key_mb8 = match curve {
            Curve::P256 => mb::mbx_nistp256_ecpublic_key_mb8,
            Curve::P384 => mb::mbx_nistp384_ecpublic_key_mb8,
        };
        // SAFETY: 8 pointers each to scalars and `x`/`y` outputs of the curve's limb count
        // (asserted above). A null `pa_pubz` asks for affine coordinates; the scratch
        // buffer is unused by the NIST curve code. Nothing is retained.
        unsafe {
            public_key_mb8(
                x.as_mut_ptr(),
                y.as_mut_ptr(),
                std::ptr::null_mut(),
                private.as_ptr(),
                std::ptr::null_mut(),
            )
        }
    }

    fn ecdh(
        &self,
        curve: Curve,
        private: Lanes<&[u64]>,
        peer_x: Lanes<&[u64]>,
        peer_y: Lanes<&[u64]>,
        mut to: Lanes<&mut [u8]>,
    ) -> mbx_status {
        let limbs = curve.limbs();
        check_lens(&private, limbs);
        check_lens(&peer_x, limbs);
        check_lens(&peer_y, limbs);
        check_lens_mut(&to, curve.byte_len());
        let (private, px, py) = (ptrs(&private), ptrs(&peer_x), ptrs(&peer_y));
        let mut to = ptrs_mut(&mut to);
        let ecdh_mb8 = match curve {
            Curve::P256 => mb::mbx_nistp256_ecdh_mb8,
            Curve::P384 => mb::mbx_nistp384_ecdh_mb8,
        };
        // SAFETY: 8 pointers each to a scalar and affine peer coordinates of the curve's
        // limb count and to outputs of its byte length (asserted above). A null `pa_pubz`
        // means affine input; the scratch buffer is unused. Nothing is retained.
        unsafe {
            ecdh_mb8(
                to.as_mut_ptr(),
                private.as_ptr(),
                px.as_ptr(),
                py.as_ptr(),
                std::ptr::null(),
                std::ptr::null_mut(),
            )
        }
    }

    fn ecdsa_sign(
        &self,
        curve: Curve,
        digest: Lanes<&[u8]>,
        nonce: Lanes<&[u64]>,
        key: Lanes<&[u64]>,
        mut r: Lanes<&mut [u8]>,
        mut s: Lanes<&mut [u8]>,
    ) -> mbx_status {
        let (len, limbs) = (curve.byte_len(), curve.limbs());
        check_lens(&digest, len);
        check_lens(&nonce, limbs);
        check_lens(&key, limbs);
        check_lens_mut(&r, len);
        check_lens_mut(&s, len);
        let (digest, nonce, key) = (ptrs(&digest), ptrs(&nonce), ptrs(&key));
        let (mut r, mut s) = (ptrs_mut(&mut r), ptrs_mut(&mut s));
        let sign_mb8 = match curve {
            Curve::P256 => mb::mbx_nistp256_ecdsa_sign_mb8,
            Curve::P384 => mb::mbx_nistp384_ecdsa_sign_mb8,
        };
        // SAFETY: 8 pointers each to digests and `r`/`s` outputs of the curve's byte length
        // and to nonces and keys of its limb count (asserted above); the scratch buffer is
        // unused by crypto_mb's NIST curve code, so null is allowed. Nothing is retained.
        unsafe {
            sign_mb8(
                r.as_mut_ptr(),
                s.as_mut_ptr(),
                digest.as_ptr(),
                nonce.as_ptr(),
                key.as_ptr(),
                std::ptr::null_mut(),
            )
        }
    }
}
