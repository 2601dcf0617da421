//! One record sealed or opened in place with aws-lc-rs, for the AEADs rustls negotiates.
//!
//! In place, because the record layer's buffers are laid out for it (header room,
//! plaintext, tag room): no second copy of a record exists while it is sealed or opened.
//! The nonce and additional data follow the version:
//!
//! - TLS 1.3 (RFC 8446 5.2, 5.3): nonce = iv XOR seq; AAD = the record header; the
//!   sealed text is `data || content type || zero padding`, the outer type always
//!   application_data.
//! - TLS 1.2 AES-GCM (RFC 5288): an 8-byte explicit nonce travels in the record. We send
//!   exactly what rustls sends (its `GcmMessageEncrypter`): the extracted iv is
//!   `salt(4) || 8 bytes`, the nonce is that iv XOR seq and its last 8 bytes are the
//!   explicit part. rustls sealed the handshake's last records under the same key with
//!   the same formula and lower sequence numbers, so no nonce of ours can meet one of
//!   its. AAD = `seq || type || version || plaintext length` (RFC 5246 6.2.3.3).
//! - TLS 1.2 ChaCha20-Poly1305 (RFC 7905): nonce = iv XOR seq, nothing explicit; the
//!   TLS 1.2 AAD.

use std::fmt;
use std::ops::Range;

use aws_lc_rs::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::{AlertDescription, ConnectionTrafficSecrets, ContentType};
use zeroize::Zeroizing;

use super::RecordError;

/// Bytes of a record header: type, version, length.
pub const HEADER_LEN: usize = 5;
/// Bytes of an AEAD tag, for every suite here.
pub const TAG_LEN: usize = 16;
/// Largest plaintext a record may carry (2^14).
pub const MAX_PLAINTEXT: usize = 1 << 14;
/// Largest record (header included) this layer ever accepts: TLS 1.3's ciphertext limit,
/// 2^14 + 256. TLS 1.2 allows 2^14 + 2048, but an AEAD record longer than 2^14 plus its
/// overhead holds more than 2^14 bytes of plaintext and is refused from its header.
pub const MAX_RECORD_LEN: usize = HEADER_LEN + MAX_PLAINTEXT + 256;
/// Bytes of the explicit nonce in a TLS 1.2 AES-GCM record.
const GCM_EXPLICIT_LEN: usize = 8;
/// Bytes of a nonce.
const NONCE_LEN: usize = aead::NONCE_LEN;

/// The protocol version a record layer speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// TLS 1.2.
    Tls12,
    /// TLS 1.3.
    Tls13,
}

/// How nonces and additional data are built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Construction {
    Tls13,
    Tls12Gcm,
    Tls12Chacha,
}

/// One direction's traffic key: seals or opens one record in place.
///
/// The key lives in aws-lc-rs's `LessSafeKey` (its context is cleansed when freed); our
/// copy of the iv is zeroized on drop. `Debug` shows neither.
pub struct RecordCipher {
    key: LessSafeKey,
    iv: Zeroizing<[u8; NONCE_LEN]>,
    construction: Construction,
    /// Names the key (a hash of it) in what `tests_support::record_nonces` records.
    #[cfg(test)]
    key_id: [u8; 8],
}

impl fmt::Debug for RecordCipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordCipher")
            .field("construction", &self.construction)
            .finish_non_exhaustive()
    }
}

impl RecordCipher {
    /// The cipher for `secrets` (one direction, as rustls extracted or updated them).
    pub fn new(secrets: &ConnectionTrafficSecrets, version: Version) -> Result<Self, RecordError> {
        let (algorithm, tls12, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => {
                (&aead::AES_128_GCM, Construction::Tls12Gcm, key, iv)
            }
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => {
                (&aead::AES_256_GCM, Construction::Tls12Gcm, key, iv)
            }
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, Construction::Tls12Chacha, key, iv)
            }
            _ => {
                return Err(RecordError::Unsupported(
                    "an AEAD this layer does not implement",
                ))
            }
        };
        let construction = match version {
            Version::Tls13 => Construction::Tls13,
            Version::Tls12 => tls12,
        };
        #[cfg(test)]
        let key_id = tests_support::key_id(key.as_ref());
        let key = UnboundKey::new(algorithm, key.as_ref())
            .map_err(|_| RecordError::Unsupported("a key of the wrong length"))?;
        let mut ours = Zeroizing::new([0u8; NONCE_LEN]);
        if iv.as_ref().len() != NONCE_LEN {
            return Err(RecordError::Unsupported("an iv of the wrong length"));
        }
        ours.copy_from_slice(iv.as_ref());
        Ok(Self {
            key: LessSafeKey::new(key),
            iv: ours,
            construction,
            #[cfg(test)]
            key_id,
        })
    }

    /// The name `tests_support` records this key by.
    #[cfg(test)]
    pub(crate) fn key_id_for_tests(&self) -> [u8; 8] {
        self.key_id
    }

    /// Bytes before the plaintext in a sealed record: the header, and the explicit nonce
    /// of TLS 1.2 AES-GCM.
    pub fn prefix_len(&self) -> usize {
        match self.construction {
            Construction::Tls12Gcm => HEADER_LEN + GCM_EXPLICIT_LEN,
            _ => HEADER_LEN,
        }
    }

    /// Bytes after the plaintext in a sealed record: TLS 1.3's content type, and the tag.
    pub fn suffix_len(&self) -> usize {
        match self.construction {
            Construction::Tls13 => 1 + TAG_LEN,
            _ => TAG_LEN,
        }
    }

    /// The nonce sealing record `seq` uses: iv XOR seq (for TLS 1.2 AES-GCM its last 8
    /// bytes are the explicit nonce sent).
    pub fn nonce(&self, seq: u64) -> [u8; NONCE_LEN] {
        let mut nonce = *self.iv;
        for (n, s) in nonce[4..].iter_mut().zip(seq.to_be_bytes()) {
            *n ^= s;
        }
        nonce
    }

    /// Seals `record` in place as record `seq` of content type `typ`: the plaintext is
    /// `record[prefix_len()..record.len() - suffix_len()]` (at most 2^14 bytes); the
    /// header, explicit nonce, inner type and tag are written around it.
    pub fn seal(
        &mut self,
        seq: u64,
        typ: ContentType,
        record: &mut [u8],
    ) -> Result<(), RecordError> {
        let overhead = self.prefix_len() + self.suffix_len();
        if record.len() > overhead + MAX_PLAINTEXT {
            return Err(RecordError::Unsupported(
                "more than 2^14 bytes in one record",
            ));
        }
        self.seal_unchecked(seq, typ, record)
    }

    /// [`RecordCipher::seal`] without the limit on the plaintext, so that tests can
    /// forge what a peer must not send.
    pub(crate) fn seal_unchecked(
        &mut self,
        seq: u64,
        typ: ContentType,
        record: &mut [u8],
    ) -> Result<(), RecordError> {
        let (prefix, suffix) = (self.prefix_len(), self.suffix_len());
        let Some(plain_len) = record.len().checked_sub(prefix + suffix) else {
            return Err(RecordError::Unsupported(
                "a record buffer without room for its overhead",
            ));
        };
        let nonce = self.nonce(seq);
        #[cfg(test)]
        tests_support::sealed(self.key_id, nonce);
        let body_len = (record.len() - HEADER_LEN) as u16;
        let outer = match self.construction {
            Construction::Tls13 => {
                record[prefix + plain_len] = typ.into();
                ContentType::ApplicationData
            }
            _ => typ,
        };
        let [hi, lo] = body_len.to_be_bytes();
        record[..HEADER_LEN].copy_from_slice(&[outer.into(), 3, 3, hi, lo]);
        if self.construction == Construction::Tls12Gcm {
            record[HEADER_LEN..prefix].copy_from_slice(&nonce[4..]);
        }
        let aad = self.aad(seq, &record[..HEADER_LEN], plain_len);
        let end = record.len() - TAG_LEN;
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad.as_slice()),
                &mut record[prefix..end],
            )
            .map_err(|_| RecordError::Unsupported("aws-lc refused to seal"))?;
        record[end..].copy_from_slice(tag.as_ref());
        Ok(())
    }

    /// Opens the whole record `record` (header included) in place as record `seq`:
    /// its content type (TLS 1.3: the inner one, padding removed) and where its plaintext
    /// now lies in `record`.
    pub fn open(
        &self,
        seq: u64,
        record: &mut [u8],
    ) -> Result<(ContentType, Range<usize>), RecordError> {
        let prefix = self.prefix_len();
        let min = prefix + TAG_LEN;
        if record.len() < min {
            return Err(refuse(
                AlertDescription::BadRecordMac,
                "a record too short for its tag",
            ));
        }
        let plain_len = record.len() - min;
        let nonce = match self.construction {
            Construction::Tls12Gcm => {
                let mut nonce = [0u8; NONCE_LEN];
                nonce[..4].copy_from_slice(&self.iv[..4]);
                nonce[4..].copy_from_slice(&record[HEADER_LEN..prefix]);
                nonce
            }
            _ => self.nonce(seq),
        };
        let aad = self.aad(seq, &record[..HEADER_LEN], plain_len);
        let opened = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad.as_slice()),
                &mut record[prefix..],
            )
            .map_err(|_| {
                refuse(
                    AlertDescription::BadRecordMac,
                    "a record failed authentication",
                )
            })?
            .len();
        match self.construction {
            Construction::Tls13 => inner_plaintext(&record[prefix..prefix + opened], prefix),
            _ if opened > MAX_PLAINTEXT => Err(refuse(
                AlertDescription::RecordOverflow,
                "more than 2^14 bytes of plaintext in a record",
            )),
            _ => Ok((ContentType::from(record[0]), prefix..prefix + opened)),
        }
    }

    /// The additional data: TLS 1.3's is the header; TLS 1.2's is
    /// `seq || type || version || plaintext length`.
    fn aad(&self, seq: u64, header: &[u8], plain_len: usize) -> AadBytes {
        let mut aad = AadBytes::default();
        if self.construction == Construction::Tls13 {
            aad.bytes[..HEADER_LEN].copy_from_slice(header);
            aad.len = HEADER_LEN;
            return aad;
        }
        aad.bytes[..8].copy_from_slice(&seq.to_be_bytes());
        aad.bytes[8..11].copy_from_slice(&header[..3]);
        aad.bytes[11..].copy_from_slice(&(plain_len as u16).to_be_bytes());
        aad.len = 13;
        aad
    }
}

/// TLS 1.3's TLSInnerPlaintext (RFC 8446 5.4): at most 2^14 + 1 bytes, its content type
/// the last byte that is not zero. `at` is where `inner` starts in the record.
fn inner_plaintext(inner: &[u8], at: usize) -> Result<(ContentType, Range<usize>), RecordError> {
    if inner.len() > MAX_PLAINTEXT + 1 {
        return Err(refuse(
            AlertDescription::RecordOverflow,
            "a TLSInnerPlaintext longer than 2^14 + 1 bytes",
        ));
    }
    match inner.iter().rposition(|&b| b != 0) {
        Some(end) => Ok((ContentType::from(inner[end]), at..at + end)),
        None => Err(refuse(
            AlertDescription::UnexpectedMessage,
            "a record with no content type (all zeros)",
        )),
    }
}

/// Additional data of either version, on the stack.
#[derive(Default)]
struct AadBytes {
    bytes: [u8; 13],
    len: usize,
}

impl AadBytes {
    fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

fn refuse(alert: AlertDescription, reason: &'static str) -> RecordError {
    RecordError::Refused { alert, reason }
}

/// What tests see of the ciphers: the (key, nonce) pairs sealed with, per thread.
#[cfg(test)]
pub(crate) mod tests_support {
    use std::cell::RefCell;

    use sha2::{Digest, Sha256};

    /// A key's name and a nonce sealed with under it.
    pub(crate) type Sealed = ([u8; 8], [u8; 12]);

    thread_local! {
        static SEALED: RefCell<Option<Vec<Sealed>>> = const { RefCell::new(None) };
    }

    /// A short name for a key: the start of its SHA-256.
    pub(crate) fn key_id(key: &[u8]) -> [u8; 8] {
        Sha256::digest(key)[..8].try_into().expect("8 bytes")
    }

    pub(super) fn sealed(key: [u8; 8], nonce: [u8; 12]) {
        SEALED.with(|s| {
            if let Some(sealed) = s.borrow_mut().as_mut() {
                sealed.push((key, nonce));
            }
        });
    }

    /// Runs `f`, returning every (key, nonce) this thread sealed with meanwhile.
    pub(crate) fn record_nonces(f: impl FnOnce()) -> Vec<Sealed> {
        SEALED.with(|s| *s.borrow_mut() = Some(Vec::new()));
        f();
        SEALED.with(|s| s.borrow_mut().take().unwrap_or_default())
    }
}
