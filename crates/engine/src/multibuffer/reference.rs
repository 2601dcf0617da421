//! A reference implementation of the 8-lane [`Kernels`], independent of crypto_mb, so the
//! multibuffer bookkeeping is tested on every CPU: RSA by the CRT formulas with num-bigint,
//! X25519 and NIST-curve points and ECDH with aws-lc, ECDSA from its definition
//! (r = x([k]G) mod n with aws-lc's point multiplication, s = k^-1 (z + r d) mod n).
//!
//! It computes lane by lane, records what each lane was given, and can be told to corrupt
//! one lane's RSA output or to fail one lane's status, to prove that the code around the
//! kernels notices.

use std::cell::{Cell, RefCell};

use aws_lc_rs::agreement::{self, PrivateKey, UnparsedPublicKey};
use crypto_mb_sys::{self as mb, mbx_status, LANES};
use num_bigint::BigUint;

use super::kernel::{Kernels, Lanes};
use super::nist::Curve;
use super::rsa::RsaCrtKey;

/// What one kernel call was given, lane by lane (the first input of each lane).
#[derive(Clone, Debug)]
pub struct Call {
    pub kernel: &'static str,
    pub lanes: Vec<Vec<u8>>,
}

#[derive(Default)]
pub struct Reference {
    pub calls: RefCell<Vec<Call>>,
    /// Flip a bit of this lane's RSA private-operation output.
    pub corrupt_rsa_lane: Cell<Option<usize>>,
    /// Give this lane this status nibble in every call.
    pub fail_lane: Cell<Option<(usize, u32)>>,
}

fn uint_le(limbs: &[u64]) -> BigUint {
    BigUint::from_bytes_le(
        &limbs
            .iter()
            .flat_map(|l| l.to_le_bytes())
            .collect::<Vec<u8>>(),
    )
}

fn put_be(v: &BigUint, out: &mut [u8]) {
    let bytes = v.to_bytes_be();
    assert!(bytes.len() <= out.len(), "value fits its lane");
    out.fill(0);
    let start = out.len() - bytes.len();
    out[start..].copy_from_slice(&bytes);
}

fn put_le_limbs(be: &[u8], out: &mut [u64]) {
    let v = BigUint::from_bytes_be(be);
    out.fill(0);
    for (o, d) in out.iter_mut().zip(v.iter_u64_digits()) {
        *o = d;
    }
}

fn be_of(limbs: &[u64], len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    put_be(&uint_le(limbs), &mut out);
    out
}

fn ecdh_alg(curve: Curve) -> &'static agreement::Algorithm {
    match curve {
        Curve::P256 => &agreement::ECDH_P256,
        Curve::P384 => &agreement::ECDH_P384,
    }
}

/// `[k]G` as an uncompressed point, or None if `k` is not a valid scalar.
fn base_mul(curve: Curve, k_be: &[u8]) -> Option<Vec<u8>> {
    let key = PrivateKey::from_private_key(ecdh_alg(curve), k_be).ok()?;
    Some(key.compute_public_key().ok()?.as_ref().to_vec())
}

impl Reference {
    fn record(&self, kernel: &'static str, lanes: Vec<Vec<u8>>) {
        self.calls.borrow_mut().push(Call { kernel, lanes });
    }

    /// Runs `lane` for each of the 8 lanes; a lane returning false fails with a
    /// parameter error, and the injected failure, if any, is applied.
    fn each(&self, mut lane: impl FnMut(usize) -> bool) -> mbx_status {
        let mut status = 0;
        for i in 0..LANES {
            if !lane(i) {
                status |= mb::MBX_STATUS_MISMATCH_PARAM_ERR << (4 * i);
            }
        }
        if let Some((i, code)) = self.fail_lane.get() {
            status |= code << (4 * i);
        }
        status
    }
}

impl Kernels for Reference {
    fn rsa_private_crt(
        &self,
        _bits: usize,
        keys: Lanes<&RsaCrtKey>,
        from: Lanes<&[u8]>,
        mut to: Lanes<&mut [u8]>,
    ) -> mbx_status {
        self.record("rsa_private_crt", from.iter().map(|f| f.to_vec()).collect());
        self.each(|i| {
            let k = keys[i];
            let (p, q) = (uint_le(k.p()), uint_le(k.q()));
            let c = BigUint::from_bytes_be(from[i]);
            let m1 = c.modpow(&uint_le(k.dp()), &p);
            let m2 = c.modpow(&uint_le(k.dq()), &q);
            let h = (uint_le(k.qinv()) * ((&m1 + &p) - (&m2 % &p))) % &p;
            put_be(&(m2 + h * q), to[i]);
            if self.corrupt_rsa_lane.get() == Some(i) {
                to[i][7] ^= 0x10;
            }
            true
        })
    }

    fn rsa_public_65537(
        &self,
        _bits: usize,
        n: Lanes<&[u64]>,
        from: Lanes<&[u8]>,
        mut to: Lanes<&mut [u8]>,
    ) -> mbx_status {
        self.each(|i| {
            let s = BigUint::from_bytes_be(from[i]);
            put_be(&s.modpow(&BigUint::from(65537u32), &uint_le(n[i])), to[i]);
            true
        })
    }

    fn x25519_public_key(&self, private: Lanes<&[u8]>, mut to: Lanes<&mut [u8]>) -> mbx_status {
        self.record(
            "x25519_public_key",
            private.iter().map(|k| k.to_vec()).collect(),
        );
        self.each(|i| {
            let Ok(key) = PrivateKey::from_private_key(&agreement::X25519, private[i]) else {
                return false;
            };
            to[i].copy_from_slice(key.compute_public_key().unwrap().as_ref());
            true
        })
    }

    fn x25519(
        &self,
        private: Lanes<&[u8]>,
        peer: Lanes<&[u8]>,
        mut to: Lanes<&mut [u8]>,
    ) -> mbx_status {
        self.record("x25519", private.iter().map(|k| k.to_vec()).collect());
        self.each(|i| {
            let Ok(key) = PrivateKey::from_private_key(&agreement::X25519, private[i]) else {
                return false;
            };
            let peer = UnparsedPublicKey::new(&agreement::X25519, peer[i]);
            // aws-lc refuses a low-order peer; crypto_mb returns the all-zero secret.
            let secret = agreement::agree(&key, peer, (), |s| Ok(s.to_vec()))
                .unwrap_or_else(|()| vec![0; 32]);
            to[i].copy_from_slice(&secret);
            true
        })
    }

    fn ec_public_key(
        &self,
        curve: Curve,
        private: Lanes<&[u64]>,
        mut x: Lanes<&mut [u64]>,
        mut y: Lanes<&mut [u64]>,
    ) -> mbx_status {
        let len = curve.byte_len();
        self.record(
            "ec_public_key",
            private.iter().map(|k| be_of(k, len)).collect(),
        );
        self.each(|i| {
            let Some(point) = base_mul(curve, &be_of(private[i], len)) else {
                return false;
            };
            put_le_limbs(&point[1..1 + len], x[i]);
            put_le_limbs(&point[1 + len..], y[i]);
            true
        })
    }

    fn ecdh(
        &self,
        curve: Curve,
        private: Lanes<&[u64]>,
        peer_x: Lanes<&[u64]>,
        peer_y: Lanes<&[u64]>,
        mut to: Lanes<&mut [u8]>,
    ) -> mbx_status {
        let len = curve.byte_len();
        self.record("ecdh", private.iter().map(|k| be_of(k, len)).collect());
        self.each(|i| {
            let Ok(key) = PrivateKey::from_private_key(ecdh_alg(curve), &be_of(private[i], len))
            else {
                return false;
            };
            let mut point = vec![0x04];
            point.extend(be_of(peer_x[i], len));
            point.extend(be_of(peer_y[i], len));
            // aws-lc checks the point is on the curve, as crypto_mb does.
            let peer = UnparsedPublicKey::new(ecdh_alg(curve), &point);
            match agreement::agree(&key, peer, (), |s| Ok(s.to_vec())) {
                Ok(secret) => {
                    to[i].copy_from_slice(&secret);
                    true
                }
                Err(()) => false,
            }
        })
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
        let len = curve.byte_len();
        self.record("ecdsa_sign", nonce.iter().map(|k| be_of(k, len)).collect());
        let n = BigUint::from_bytes_be(curve.order());
        self.each(|i| {
            let k = uint_le(nonce[i]);
            let Some(point) = base_mul(curve, &be_of(nonce[i], len)) else {
                return false;
            };
            let ri = BigUint::from_bytes_be(&point[1..1 + len]) % &n;
            // The digest is as long as the order, so z is the digest itself (mod n).
            let z = BigUint::from_bytes_be(digest[i]) % &n;
            let k_inv = k.modpow(&(&n - 2u32), &n);
            let si = (k_inv * (z + &ri * uint_le(key[i]))) % &n;
            put_be(&ri, r[i]);
            put_be(&si, s[i]);
            true
        })
    }
}
