//! The self-signed RSA-2048 and ECDSA P-256 certificates of the embedded default config.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::certs::{CertError, LoadedCert};

/// Why the self-signed certificates could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SelfSignedError {
    #[error("generating the self-signed certificate failed: {0}")]
    /// rcgen could not make the certificate.
    Generate(#[from] rcgen::Error),
    #[error(transparent)]
    /// The generated certificate could not be loaded.
    Load(#[from] CertError),
}

/// How long a self-signed certificate is valid: browsers refuse leaf certificates valid
/// for more than 398 days, and TLS scanners flag them (it is remade at every start).
const VALIDITY: Duration = Duration::from_secs(397 * 24 * 3600);

/// Makes a fresh RSA-2048 and ECDSA P-256 certificate for `names`, valid from a day ago
/// (clients whose clock is a little behind) for [`VALIDITY`].
pub fn generate(names: &[String]) -> Result<Vec<LoadedCert>, SelfSignedError> {
    let rsa = rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)?;
    let ecdsa = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    [rsa, ecdsa]
        .into_iter()
        .map(|key| {
            let mut params = rcgen::CertificateParams::new(names.to_vec())?;
            params.distinguished_name = rcgen::DistinguishedName::new();
            params.distinguished_name.push(
                rcgen::DnType::CommonName,
                names.first().map_or("localhost", |n| n.as_str()),
            );
            let since_epoch = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .saturating_sub(Duration::from_secs(24 * 3600));
            params.not_before = rcgen::date_time_ymd(1970, 1, 1) + since_epoch;
            params.not_after = params.not_before + VALIDITY;
            let cert = params.self_signed(&key)?;
            let origin = Path::new("<self-signed>");
            Ok(LoadedCert::from_pem(
                cert.pem().as_bytes(),
                origin,
                key.serialize_pem().as_bytes(),
                origin,
            )?)
        })
        .collect()
}
