//! The tests' certificate authority, made with rcgen in-process: a CA and the server and
//! client certificates it signs, written as PEM files for terminus, curl, openssl and
//! the Python upstreams to read. (Self-signed server certificates come from
//! [`super::make_cert`], the openssl CLI: an implementation apart from terminus's
//! own, and the only one of the two that makes the weak keys the error tests need.)

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType, PKCS_ECDSA_P256_SHA256, PKCS_RSA_SHA256,
};

use super::{CertPair, KeyKind};

/// A CA: its certificate in `dir/STEM.pem`, its key in `dir/STEM.key` (for `openssl ca`,
/// which signs its CRLs).
pub struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
    /// The CA's certificate and key files.
    pub pair: CertPair,
}

/// What a certificate [`Ca::issue`] signs says.
pub struct Leaf {
    /// The subject's common name, and its DNS names (server certificates).
    pub common_name: String,
    pub dns: Vec<String>,
    /// The subject's organization, if any.
    pub organization: Option<String>,
    /// URIs among its names (a SPIFFE id).
    pub uris: Vec<String>,
    pub key: KeyKind,
    /// `clientAuth` rather than `serverAuth`.
    pub client: bool,
    /// Days of validity from today.
    pub days: u32,
}

impl Leaf {
    /// A server certificate for `name` (CN and DNS name), ECDSA P-256, two days.
    pub fn server(name: &str) -> Leaf {
        Leaf {
            common_name: name.to_owned(),
            dns: vec![name.to_owned()],
            organization: None,
            uris: Vec::new(),
            key: KeyKind::EcdsaP256,
            client: false,
            days: 2,
        }
    }

    /// A client certificate for `name` (CN only), ECDSA P-256, two days.
    pub fn client(name: &str) -> Leaf {
        Leaf {
            common_name: name.to_owned(),
            dns: Vec::new(),
            organization: None,
            uris: Vec::new(),
            key: KeyKind::EcdsaP256,
            client: true,
            days: 2,
        }
    }
}

impl Ca {
    /// A CA named `common_name` (ECDSA P-256, `days` from today), written to
    /// `dir/STEM.pem` and `dir/STEM.key`.
    pub fn new(dir: &Path, stem: &str, common_name: &str, days: u32) -> Ca {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        valid_for(&mut params, days);
        let cert = params.self_signed(&key).unwrap();
        let pair = write(dir, stem, &cert, &key);
        Ca { cert, key, pair }
    }

    /// A certificate saying `leaf`, signed by this CA, written to `dir/STEM.pem` and
    /// `dir/STEM.key`.
    pub fn issue(&self, dir: &Path, stem: &str, leaf: &Leaf) -> CertPair {
        let (params, key) = leaf_params(leaf);
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        write(dir, stem, &cert, &key)
    }
}

/// A certificate saying `leaf`, signed by its own key (a client's identity that a peer
/// trusts as it is), written to `dir/STEM.pem` and `dir/STEM.key`.
pub fn self_signed(dir: &Path, stem: &str, leaf: &Leaf) -> CertPair {
    let (mut params, key) = leaf_params(leaf);
    // No keyUsage: with one that lacks keyCertSign, OpenSSL would not take the
    // certificate as its own issuer, and a peer trusting it as it is would not verify it.
    params.key_usages.clear();
    let cert = params.self_signed(&key).unwrap();
    write(dir, stem, &cert, &key)
}

fn leaf_params(leaf: &Leaf) -> (CertificateParams, KeyPair) {
    let key = match leaf.key {
        KeyKind::EcdsaP256 => KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256),
        KeyKind::Rsa(2048) => KeyPair::generate_rsa_for(&PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048),
        _ => panic!("the CA's leaves are ECDSA P-256 or RSA-2048"),
    }
    .unwrap();
    let mut params = CertificateParams::default();
    if let Some(org) = &leaf.organization {
        params
            .distinguished_name
            .push(DnType::OrganizationName, org.as_str());
    }
    params
        .distinguished_name
        .push(DnType::CommonName, leaf.common_name.as_str());
    params.subject_alt_names = leaf
        .dns
        .iter()
        .map(|n| SanType::DnsName(n.as_str().try_into().unwrap()))
        .chain(
            leaf.uris
                .iter()
                .map(|u| SanType::URI(u.as_str().try_into().unwrap())),
        )
        .collect();
    params.is_ca = IsCa::ExplicitNoCa;
    // keyEncipherment for an RSA server key, as for RSA key exchange (TLS 1.2 scanners
    // such as testssl look for it).
    params.key_usages = if !leaf.client && matches!(leaf.key, KeyKind::Rsa(_)) {
        vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ]
    } else {
        vec![KeyUsagePurpose::DigitalSignature]
    };
    params.extended_key_usages = vec![if leaf.client {
        ExtendedKeyUsagePurpose::ClientAuth
    } else {
        ExtendedKeyUsagePurpose::ServerAuth
    }];
    valid_for(&mut params, leaf.days);
    (params, key)
}

/// Valid from the start of today (UTC) for `days`.
fn valid_for(params: &mut CertificateParams, days: u32) {
    let today = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 86_400;
    let (y, m, d) = civil(today);
    params.not_before = rcgen::date_time_ymd(y, m, d);
    let (y, m, d) = civil(today + u64::from(days));
    params.not_after = rcgen::date_time_ymd(y, m, d);
}

/// The date (year, month, day) of day `days` since 1970-01-01: Howard Hinnant's
/// civil_from_days, for days after the epoch.
fn civil(days: u64) -> (i32, u8, u8) {
    let z = days as i64 + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year as i32, month as u8, day as u8)
}

fn write(dir: &Path, stem: &str, cert: &rcgen::Certificate, key: &KeyPair) -> CertPair {
    let cert_path: PathBuf = dir.join(format!("{stem}.pem"));
    let key_path = dir.join(format!("{stem}.key"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    CertPair {
        cert: cert_path,
        key: key_path,
    }
}
