//! The state directory: the ACME account and the certificates, as files an operator can
//! read and back up.
//!
//! ```text
//! STATE_DIR/accounts/<directory host>-<hash>.json   the account's URL and key (instant-acme's credentials)
//! STATE_DIR/certificates/<first name>/rsa2048.pem   the key, then the chain (leaf first)
//! STATE_DIR/certificates/<first name>/ecdsa-p256.pem
//! ```
//!
//! A certificate's key and chain share one file (HAProxy's `crt` layout), so that one
//! rename replaces both: a crash between two renames would leave a key that does not
//! match its certificate, and the server would refuse to load it. Every file is written
//! to a temporary name in the same directory with mode 0600, synced, then renamed over
//! the old one. What a stored certificate covers is read from its subjectAltNames, so
//! a server whose names changed gets a new certificate.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rustls::pki_types::CertificateDer;
use zeroize::Zeroizing;

use crate::schedule::Validity;

/// The two certificates a server gets: one for each key type a client may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CertKind {
    /// RSA-2048 (every client; crypto_mb batches its signatures).
    Rsa2048,
    /// ECDSA P-256 (cheaper handshakes for clients that take it).
    EcdsaP256,
}

impl CertKind {
    /// Both, in the order they are ordered.
    pub const ALL: [CertKind; 2] = [CertKind::EcdsaP256, CertKind::Rsa2048];

    /// Its name in files, metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Self::Rsa2048 => "rsa2048",
            Self::EcdsaP256 => "ecdsa-p256",
        }
    }
}

/// A certificate found in the state directory.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The file (key and chain).
    pub path: PathBuf,
    /// The leaf.
    pub leaf: CertificateDer<'static>,
    /// Its validity.
    pub validity: Validity,
    /// Its serial number, hex.
    pub serial: String,
    /// The names it is for (subjectAltName dNSNames, lower case).
    pub names: BTreeSet<String>,
}

impl Stored {
    /// The certificate in `file` (a key and a chain, PEM), kept at `path`.
    pub fn parse(path: PathBuf, file: &[u8]) -> io::Result<Self> {
        let leaf = rustls_pemfile::certs(&mut &file[..])
            .next()
            .transpose()?
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no certificate in it"))?;
        let (validity, serial, names) = parse_leaf(&leaf).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })?;
        Ok(Self {
            path,
            leaf,
            validity,
            serial,
            names,
        })
    }

    /// Whether it is for exactly `names` and can be served at `now`.
    pub fn serves(&self, names: &[String], now: SystemTime) -> bool {
        self.validity.valid_at(now) && self.names == name_set(names)
    }
}

fn name_set(names: &[String]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_ascii_lowercase()).collect()
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    /// The state directory at `root` (made when first written).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// Makes the directory (0700) and checks that files can be written in it.
    pub fn probe(&self) -> io::Result<()> {
        let probe = self.root.join(".probe");
        write_atomic(&probe, b"terminus")?;
        fs::remove_file(probe)
    }

    /// Where the account for `directory` is kept.
    pub fn account_path(&self, directory: &str) -> PathBuf {
        let host = directory
            .split("://")
            .nth(1)
            .unwrap_or(directory)
            .split(['/', ':'])
            .next()
            .unwrap_or("acme");
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, directory.as_bytes());
        let hash: String = digest.as_ref()[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        self.root
            .join("accounts")
            .join(format!("{}-{hash}.json", safe(host)))
    }

    /// Where `names`' certificate of `kind` is kept.
    pub fn certificate_path(&self, names: &[String], kind: CertKind) -> PathBuf {
        let first = names.first().map_or("default", String::as_str);
        self.root
            .join("certificates")
            .join(safe(&first.to_ascii_lowercase()))
            .join(format!("{}.pem", kind.name()))
    }

    /// The stored certificate of `kind` for `names`' server, if there is one that
    /// parses (whatever its validity and names: the caller decides).
    pub fn load(&self, names: &[String], kind: CertKind) -> io::Result<Option<Stored>> {
        let path = self.certificate_path(names, kind);
        match self.read(names, kind)? {
            Some(file) => Stored::parse(path, &file).map(Some),
            None => Ok(None),
        }
    }

    /// The file of `names`' certificate of `kind` (key, then chain), if there is one.
    pub fn read(&self, names: &[String], kind: CertKind) -> io::Result<Option<Zeroizing<Vec<u8>>>> {
        match fs::read(self.certificate_path(names, kind)) {
            Ok(file) => Ok(Some(Zeroizing::new(file))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Keeps `file` (the key, then the chain, PEM) as `names`' certificate of `kind`,
    /// replacing the old one at once; returns what was stored.
    pub fn save(&self, names: &[String], kind: CertKind, file: &[u8]) -> io::Result<Stored> {
        let path = self.certificate_path(names, kind);
        write_atomic(&path, file)?;
        self.load(names, kind)?
            .ok_or_else(|| io::Error::other("the certificate just written is gone"))
    }

    /// The account kept for `directory`, as instant-acme's credentials JSON.
    pub fn load_account(&self, directory: &str) -> io::Result<Option<Zeroizing<Vec<u8>>>> {
        match fs::read(self.account_path(directory)) {
            Ok(json) => Ok(Some(Zeroizing::new(json))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Keeps the account for `directory`.
    pub fn save_account(&self, directory: &str, json: &[u8]) -> io::Result<()> {
        write_atomic(&self.account_path(directory), json)
    }
}

/// A file name from a DNS name or host: its letters, digits, dots and dashes.
fn safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Writes `bytes` to `path` whole or not at all: a temporary file beside it (mode 0600,
/// synced), renamed over it, the directory synced.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    // A name no other writer (another process sharing the volume, PID 1 in its own
    // container too) picks, created new: nothing already there is written through.
    let mut random = [0u8; 8];
    aws_lc_rs::rand::fill(&mut random).map_err(|_| io::Error::other("no randomness"))?;
    let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let tmp = dir.join(format!(".{name}.{suffix}.tmp"));
    let written = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            // Never through a symbolic link.
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// A leaf's validity, serial and DNS names.
pub(crate) fn parse_leaf(
    leaf: &CertificateDer<'_>,
) -> Result<
    (Validity, String, BTreeSet<String>),
    x509_parser::nom::Err<x509_parser::error::X509Error>,
> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf)?;
    let time = |t: x509_parser::time::ASN1Time| {
        let secs = t.timestamp();
        if secs >= 0 {
            SystemTime::UNIX_EPOCH + Duration::from_secs(secs as u64)
        } else {
            SystemTime::UNIX_EPOCH
        }
    };
    let validity = Validity {
        not_before: time(cert.validity().not_before),
        not_after: time(cert.validity().not_after),
    };
    let mut names = BTreeSet::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(dns) = name {
                names.insert(dns.to_ascii_lowercase());
            }
        }
    }
    let serial = cert.raw_serial_as_string().replace(':', "");
    Ok((validity, serial, names))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key and its self-signed certificate, as one file.
    fn self_signed(names: &[&str]) -> String {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        key.serialize_pem() + &params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn a_certificate_is_stored_whole_mode_0600_and_read_back_by_its_names() {
        let dir = std::env::temp_dir().join(format!("terminus-acme-store-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let state = StateDir::new(&dir);
        let names = vec!["a.test".to_owned(), "www.a.test".to_owned()];
        assert!(state.load(&names, CertKind::EcdsaP256).unwrap().is_none());
        let file = self_signed(&["a.test", "www.a.test"]);
        let stored = state
            .save(&names, CertKind::EcdsaP256, file.as_bytes())
            .unwrap();
        let now = SystemTime::now();
        assert!(stored.serves(&names, now));
        assert!(
            !stored.serves(&names[..1], now),
            "a name more or less: another certificate"
        );
        let mode = fs::metadata(&stored.path).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        // Key and chain in one file, which the server's loader takes as both.
        terminus_tls::LoadedCert::from_files(&stored.path, &stored.path).unwrap();
        // Replaced whole: the new serial, no temporary file left behind.
        let file2 = self_signed(&["a.test", "www.a.test"]);
        let again = state
            .save(&names, CertKind::EcdsaP256, file2.as_bytes())
            .unwrap();
        assert_ne!(again.serial, stored.serial);
        let left: Vec<_> = fs::read_dir(stored.path.parent().unwrap())
            .unwrap()
            .collect();
        assert_eq!(left.len(), 1, "{left:?}");
        state.save_account("https://ca.test/dir", b"{}").unwrap();
        assert_eq!(
            state
                .load_account("https://ca.test/dir")
                .unwrap()
                .as_deref(),
            Some(&b"{}".to_vec())
        );
        assert!(state
            .load_account("https://other.test/dir")
            .unwrap()
            .is_none());
        fs::remove_dir_all(&dir).unwrap();
    }
}
