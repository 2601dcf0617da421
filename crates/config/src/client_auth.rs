//! `[[server]] client_auth = { mode = "required", ca = "clients.pem", crl = ["crl.pem"],
//! depth = 2 }`: client certificates (mutual TLS), as nginx's `ssl_verify_client`,
//! `ssl_client_certificate`, `ssl_crl` and `ssl_verify_depth`.

use serde::Deserialize;
use terminus_tls::{ClientAuthMode, ClientAuthPolicy};
use toml::Spanned;

use super::{ConfigError, Ctx};

/// `client_auth` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientAuthSection {
    pub mode: Option<String>,
    pub ca: Option<String>,
    #[serde(default)]
    pub crl: Vec<String>,
    pub depth: Option<u32>,
}

/// The policy, its files' paths resolved (they are read when the site is built, so that
/// a reload re-reads the CRLs).
pub fn resolve(
    section: &Spanned<ClientAuthSection>,
    ctx: &Ctx<'_>,
) -> Result<ClientAuthPolicy, ConfigError> {
    let at = Some(section.span());
    let c = section.get_ref();
    let mode = match c.mode.as_deref() {
        None | Some("required") => ClientAuthMode::Required,
        Some("optional") => ClientAuthMode::Optional,
        Some(other) => {
            return Err(ctx.err(
                at,
                format!("client_auth mode = {other:?} is not a mode"),
                Some(
                    "mode = \"required\" (no valid certificate, no handshake) or \"optional\""
                        .to_owned(),
                ),
            ))
        }
    };
    let Some(ca) = &c.ca else {
        return Err(ctx.err(
            at,
            "client_auth needs ca: the CA certificates (PEM) that sign the clients",
            Some("client_auth = { mode = \"required\", ca = \"clients-ca.pem\" }".to_owned()),
        ));
    };
    if c.depth == Some(0) {
        return Err(ctx.err(
            at,
            "client_auth depth = 0 admits no certificate",
            Some("depth = 1: issued by a CA in ca; 2: through one intermediate".to_owned()),
        ));
    }
    Ok(ClientAuthPolicy {
        mode,
        ca: ctx.path(ca),
        crls: c.crl.iter().map(|p| ctx.path(p)).collect(),
        depth: c.depth,
    })
}
