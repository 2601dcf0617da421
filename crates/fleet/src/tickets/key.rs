//! One ticket key: a random name, carried in the clear at the front of every ticket it
//! seals so that any instance finds the key again, and a 256-bit AES-GCM-SIV key.
//!
//! AES-GCM-SIV because the nonces are random: a ticket key seals millions of tickets a
//! period, and a repeated random nonce, harmless to GCM-SIV beyond showing two equal
//! tickets, would give away GCM's authentication key. The name is the additional data,
//! so a ticket cannot be moved under another name.
//!
//! A store holds keys wrapped (AES-256-GCM under a key-encryption key from a file), with
//! the store's name for the entry as additional data: whoever reads the store without
//! the key file learns nothing, and an entry copied under another epoch does not open.
//!
//! What needs integrity only and is written often (quota share reports) is not sealed
//! under that key: it is authenticated with HMAC-SHA256 under a subkey derived from the key
//! file for its purpose alone (HKDF-SHA256, [`Kek::subkey`]), which has no nonce to run
//! out of and cannot forge anything the wrapping key protects.

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, AES_256_GCM_SIV};
use aws_lc_rs::{hkdf, hmac};
use zeroize::Zeroizing;

use crate::error::KeyFileError;

/// Bytes of a key's name.
pub const NAME_LEN: usize = 16;
const SECRET_LEN: usize = 32;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
/// HKDF's salt for the key file's subkeys (the key file is uniformly random already; a
/// fixed salt names the scheme).
const SUBKEY_SALT: &[u8] = b"terminus fleet key file subkeys";

/// A key's name and secret: as made, and as a store keeps them (wrapped). Zeroed when
/// dropped.
#[derive(Clone)]
pub struct KeyMaterial(Zeroizing<[u8; NAME_LEN + SECRET_LEN]>);

impl std::fmt::Debug for KeyMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The name only: the secret is never printed.
        write!(f, "KeyMaterial({})", hex(&self.name()))
    }
}

impl KeyMaterial {
    /// A new key from the system's CSPRNG.
    pub fn generate() -> Self {
        let mut bytes = Zeroizing::new([0u8; NAME_LEN + SECRET_LEN]);
        aws_lc_rs::rand::fill(&mut bytes[..]).expect("the system CSPRNG");
        Self(bytes)
    }

    /// The name tickets sealed with it carry.
    pub fn name(&self) -> [u8; NAME_LEN] {
        self.0[..NAME_LEN].try_into().expect("name length")
    }

    /// The key that seals and opens tickets.
    pub fn key(&self) -> TicketKey {
        let unbound = UnboundKey::new(&AES_256_GCM_SIV, &self.0[NAME_LEN..])
            .expect("a 256-bit key for AES-256-GCM-SIV");
        TicketKey {
            name: self.name(),
            aead: LessSafeKey::new(unbound),
        }
    }

    /// The material sealed under `kek`, bound to `label` (the store's name for it).
    pub fn wrap(&self, kek: &Kek, label: &[u8]) -> Vec<u8> {
        kek.seal(label, &self.0[..])
    }

    /// The material `wrap` sealed under `kek` with `label`; `None` if it does not open
    /// (another key file, another label, or damaged).
    pub fn unwrap(kek: &Kek, label: &[u8], wrapped: &[u8]) -> Option<Self> {
        let plain = kek.open(label, wrapped)?;
        if plain.len() != NAME_LEN + SECRET_LEN {
            return None;
        }
        let mut bytes = Zeroizing::new([0u8; NAME_LEN + SECRET_LEN]);
        bytes.copy_from_slice(&plain);
        Some(Self(bytes))
    }
}

/// A key that seals and opens tickets.
pub struct TicketKey {
    name: [u8; NAME_LEN],
    aead: LessSafeKey,
}

impl TicketKey {
    /// Its name.
    pub fn name(&self) -> &[u8; NAME_LEN] {
        &self.name
    }

    /// `plain` sealed: the name, a random nonce, the ciphertext and its tag.
    pub fn seal(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let nonce = random_nonce();
        let mut out = Vec::with_capacity(NAME_LEN + NONCE_LEN + plain.len() + TAG_LEN);
        out.extend_from_slice(&self.name);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plain);
        let tag = self
            .aead
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&self.name),
                &mut out[NAME_LEN + NONCE_LEN..],
            )
            .ok()?;
        out.extend_from_slice(tag.as_ref());
        Some(out)
    }

    /// What `seal` sealed, if `ticket` is one of this key's and intact.
    pub fn open(&self, ticket: &[u8]) -> Option<Vec<u8>> {
        if ticket.len() < NAME_LEN + NONCE_LEN + TAG_LEN || ticket[..NAME_LEN] != self.name {
            return None;
        }
        let nonce =
            Nonce::try_assume_unique_for_key(&ticket[NAME_LEN..NAME_LEN + NONCE_LEN]).ok()?;
        let mut in_out = ticket[NAME_LEN + NONCE_LEN..].to_vec();
        let plain = self
            .aead
            .open_in_place(nonce, Aad::from(&self.name), &mut in_out)
            .ok()?;
        let len = plain.len();
        in_out.truncate(len);
        Some(in_out)
    }
}

/// The key-encryption key (the fleet's key file) that seals what a store keeps secret:
/// ticket keys, and ACME's account and certificate keys; and the root of the subkeys that
/// authenticate what must only not be forged (quota share reports, [`Kek::subkey`]).
pub struct Kek {
    wrap: LessSafeKey,
    /// HKDF-SHA256's pseudorandom key extracted from the key file (zeroed by aws-lc-rs when
    /// dropped), for the subkeys.
    prk: hkdf::Prk,
}

impl std::fmt::Debug for Kek {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Kek(..)")
    }
}

impl Kek {
    /// The key written in `text`: 64 hexadecimal digits (`openssl rand -hex 32`), blank
    /// space around them ignored.
    pub fn from_hex(text: &str) -> Result<Self, KeyFileError> {
        let text = text.trim();
        if text.len() != 2 * SECRET_LEN || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(KeyFileError::NotHex { len: text.len() });
        }
        let mut bytes = Zeroizing::new([0u8; SECRET_LEN]);
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).expect("hex digits");
        }
        let unbound = UnboundKey::new(&AES_256_GCM, &bytes[..]).expect("a 256-bit key");
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, SUBKEY_SALT).extract(&bytes[..]);
        Ok(Self {
            wrap: LessSafeKey::new(unbound),
            prk,
        })
    }

    /// An HMAC-SHA256 key for one purpose, named by `info` (e.g. `"terminus fleet
    /// quota-report v1"`): HKDF-SHA256 from the key file, so that what is authenticated
    /// for one purpose is never valid for another, nor under the wrapping key.
    pub fn subkey(&self, info: &str) -> hmac::Key {
        let info = [info.as_bytes()];
        self.prk
            .expand(&info, hmac::HMAC_SHA256)
            .expect("a 32-byte HKDF-SHA256 output")
            .into()
    }

    /// `plain` sealed under this key, bound to `label` (the store's name for the entry):
    /// a random nonce, the ciphertext, the tag. Whatever a fleet keeps secret in its
    /// store (ticket keys, ACME's account and certificate keys) is sealed here.
    pub fn seal(&self, label: &[u8], plain: &[u8]) -> Vec<u8> {
        let nonce = random_nonce();
        let mut out = Vec::with_capacity(NONCE_LEN + plain.len() + TAG_LEN);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plain);
        let tag = self
            .wrap
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(label),
                &mut out[NONCE_LEN..],
            )
            .expect("sealing under the key file's key");
        out.extend_from_slice(tag.as_ref());
        out
    }

    /// What [`Kek::seal`] sealed with `label`; `None` if it does not open (another key
    /// file, another label, or damaged). Zeroed when dropped.
    pub fn open(&self, label: &[u8], sealed: &[u8]) -> Option<Zeroizing<Vec<u8>>> {
        if sealed.len() < NONCE_LEN + TAG_LEN {
            return None;
        }
        let nonce = Nonce::try_assume_unique_for_key(&sealed[..NONCE_LEN]).ok()?;
        let mut in_out = Zeroizing::new(sealed[NONCE_LEN..].to_vec());
        let len = self
            .wrap
            .open_in_place(nonce, Aad::from(label), &mut in_out[..])
            .ok()?
            .len();
        in_out.truncate(len);
        Some(in_out)
    }
}

fn random_nonce() -> [u8; NONCE_LEN] {
    let mut nonce = [0u8; NONCE_LEN];
    aws_lc_rs::rand::fill(&mut nonce).expect("the system CSPRNG");
    nonce
}

/// `bytes` in lowercase hexadecimal (key names in logs and metrics).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_ticket_opens_with_its_key_only_and_not_once_altered() {
        let (a, b) = (KeyMaterial::generate(), KeyMaterial::generate());
        let (ka, kb) = (a.key(), b.key());
        let ticket = ka.seal(b"session state").unwrap();
        assert_eq!(&ticket[..NAME_LEN], &a.name());
        assert_eq!(ka.open(&ticket).as_deref(), Some(&b"session state"[..]));
        assert_eq!(kb.open(&ticket), None);
        for i in [0, NAME_LEN, NAME_LEN + NONCE_LEN, ticket.len() - 1] {
            let mut bad = ticket.clone();
            bad[i] ^= 1;
            assert_eq!(ka.open(&bad), None, "byte {i} flipped");
        }
        // Two seals of the same state differ (random nonces).
        assert_ne!(ka.seal(b"session state").unwrap(), ticket);
    }

    /// Cross-checked against an independent AES-256-GCM-SIV: RFC 8452's test vector
    /// (appendix C.2, the first with a 256-bit key and a message).
    #[test]
    fn the_ticket_aead_is_aes_256_gcm_siv_as_rfc_8452_gives_it() {
        let key = [
            0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            0, 0, 0, 0,
        ];
        let mut material = [0u8; NAME_LEN + SECRET_LEN];
        material[NAME_LEN..].copy_from_slice(&key);
        let material = KeyMaterial(Zeroizing::new(material));
        let aead = material.key().aead;
        let nonce = [0x03, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let mut in_out = vec![0x01, 0, 0, 0, 0, 0, 0, 0];
        let tag = aead
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::empty(),
                &mut in_out,
            )
            .unwrap();
        in_out.extend_from_slice(tag.as_ref());
        assert_eq!(
            hex(&in_out),
            "c2ef328e5c71c83b843122130f7364b761e0b97427e3df28"
        );
    }

    #[test]
    fn wrapped_material_opens_only_with_its_kek_and_label() {
        let kek = Kek::from_hex(&"ab".repeat(32)).unwrap();
        let other = Kek::from_hex(&"cd".repeat(32)).unwrap();
        let material = KeyMaterial::generate();
        let wrapped = material.wrap(&kek, b"terminus:ticket-key:6:100");
        assert!(!wrapped
            .windows(SECRET_LEN)
            .any(|w| w == &material.0[NAME_LEN..]));
        let back = KeyMaterial::unwrap(&kek, b"terminus:ticket-key:6:100", &wrapped).unwrap();
        assert_eq!(back.name(), material.name());
        assert!(KeyMaterial::unwrap(&other, b"terminus:ticket-key:6:100", &wrapped).is_none());
        assert!(KeyMaterial::unwrap(&kek, b"terminus:ticket-key:6:101", &wrapped).is_none());
        assert!(Kek::from_hex("abc").is_err());
        assert!(Kek::from_hex(&"zz".repeat(32)).is_err());
    }

    #[test]
    fn subkeys_are_hkdf_sha256_of_the_key_file_one_per_purpose() {
        let kek = Kek::from_hex(&"ab".repeat(32)).unwrap();
        let tag = |key: &hmac::Key| hex(hmac::sign(key, b"m").as_ref());
        let a = tag(&kek.subkey("terminus fleet quota-report v1"));
        assert_eq!(a, tag(&kek.subkey("terminus fleet quota-report v1")));
        assert_ne!(a, tag(&kek.subkey("terminus fleet something else v1")));
        assert_ne!(a, tag(&hmac::Key::new(hmac::HMAC_SHA256, &[0xab; 32])));
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, SUBKEY_SALT).extract(&[0xab; 32]);
        let expected: hmac::Key = prk
            .expand(&[b"terminus fleet quota-report v1"], hmac::HMAC_SHA256)
            .unwrap()
            .into();
        assert_eq!(a, tag(&expected));
        assert_eq!(format!("{kek:?}"), "Kek(..)", "the key is never printed");
    }
}
