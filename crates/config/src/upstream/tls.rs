//! `tls = { ... }` on an `[[upstream]]`: re-encryption to its servers. Certificates are
//! verified unless the operator writes `verify = false` (a warning says so at every
//! load), against `ca` or the system bundle; the name checked is `server_name`, else each
//! server's host as written (nginx's `proxy_ssl_name` default), else its address. `cert`
//! and `key` are shown to servers that ask for a client certificate (nginx's
//! `proxy_ssl_certificate`).

use serde::Deserialize;
use terminus_proxy::connect::UpstreamTls;
use terminus_proxy::spec::Protocol;
use terminus_tls::client::{load_identity, Trust};
use toml::Spanned;

use crate::{ConfigError, Ctx};

/// `tls = { server_name = "app.internal", ca = "ca.pem", verify = true }` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    pub server_name: Option<Spanned<String>>,
    pub ca: Option<Spanned<String>>,
    pub verify: Option<Spanned<bool>>,
    /// A client certificate chain and its key, for servers that ask for one.
    pub cert: Option<Spanned<String>>,
    pub key: Option<Spanned<String>>,
}

pub(super) fn resolve(
    tls: &Spanned<TlsSection>,
    upstream: &str,
    protocol: Protocol,
    ctx: &Ctx<'_>,
) -> Result<UpstreamTls, ConfigError> {
    let section = tls.get_ref();
    let server_name = match &section.server_name {
        None => None,
        Some(name) => Some(name.get_ref().clone().try_into().map_err(|_| {
            ctx.err(
                Some(name.span()),
                format!("server_name {:?} is not a DNS name or IP address", name.get_ref()),
                Some("the name the upstream's certificate is issued for: server_name = \"app.internal\"".to_owned()),
            )
        })?),
    };
    let verify = section.verify.as_ref().map(|v| *v.get_ref()) != Some(false);
    let trust = match (&section.ca, verify) {
        (Some(ca), false) => {
            return Err(ctx.err(
                Some(ca.span()),
                "ca is not used when verify = false",
                Some("keep ca and verify = true (recommended), or drop ca".to_owned()),
            ))
        }
        (Some(ca), true) => Trust::CaFile(ctx.path(ca.get_ref())),
        (None, true) => Trust::System,
        (None, false) => {
            tracing::warn!(
                upstream,
                "upstream TLS certificates are not verified (verify = false): anyone on the path can pose as its servers"
            );
            Trust::Insecure
        }
    };
    let identity = match (&section.cert, &section.key) {
        (None, None) => None,
        (Some(cert), Some(key)) => Some(
            load_identity(&ctx.path(cert.get_ref()), &ctx.path(key.get_ref())).map_err(
                |e| {
                    ctx.err(
                        Some(cert.span()),
                        format!("upstream {upstream:?} tls: {e}"),
                        Some("cert is the client certificate chain (PEM, leaf first), key its unencrypted private key".to_owned()),
                    )
                },
            )?,
        ),
        (Some(c), None) | (None, Some(c)) => {
            return Err(ctx.err(
                Some(c.span()),
                "tls cert and key go together",
                Some("tls = { cert = \"client.pem\", key = \"client.key\" }".to_owned()),
            ))
        }
    };
    UpstreamTls::new(server_name, trust, identity, protocol).map_err(|e| {
        ctx.err(
            section.ca.as_ref().map_or(Some(tls.span()), |c| Some(c.span())),
            format!("upstream {upstream:?} tls: {e}"),
            Some("ca = \"FILE\": the PEM certificate(s) of the CA that signed the servers' certificates".to_owned()),
        )
    })
}
