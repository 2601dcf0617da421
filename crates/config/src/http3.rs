//! `[http3]`: Retry, the limit of QUIC handshakes in flight per worker, and 0-RTT. Which
//! listeners take QUIC is `listen`'s `http3 = true`.

use terminus_quic::{Limits, Retry};
use terminus_tls::TlsSettings;

use crate::schema::ConfigFile;
use crate::{ConfigError, Ctx};

/// `[http3]`: Retry and the limit of QUIC handshakes in flight per worker.
pub(crate) fn limits(raw: &ConfigFile, ctx: &Ctx<'_>) -> Result<Limits, ConfigError> {
    let section = &raw.http3;
    let max_handshakes = match &section.max_handshakes {
        None => Limits::MAX_HANDSHAKES,
        Some(n) if *n.get_ref() == 0 => {
            return Err(ctx.err(
                Some(n.span()),
                "[http3] max_handshakes = 0 would refuse every QUIC connection",
                Some(format!(
                    "max_handshakes = {} (the default), or leave http3 off the listeners",
                    Limits::MAX_HANDSHAKES
                )),
            ))
        }
        Some(n) => *n.get_ref(),
    };
    let retry = match section.retry.as_ref().map(|r| (r.get_ref().as_str(), r.span())) {
        None | Some(("auto", _)) => Retry::Above(max_handshakes / 2),
        Some(("always", _)) => Retry::Always,
        Some(("never", _)) => Retry::Never,
        Some((other, span)) => {
            return Err(ctx.err(
                Some(span),
                format!("[http3] retry = {other:?} is not a Retry policy"),
                Some("retry = \"auto\" (when half of max_handshakes are in flight), \"always\" or \"never\"".to_owned()),
            ))
        }
    };
    Ok(Limits {
        retry,
        max_handshakes,
        ..Limits::default()
    })
}

/// `[http3] early_data`: 0-RTT, which needs the session cache (rustls takes early data
/// only on sessions from it, each once).
pub(crate) fn early_data(
    raw: &ConfigFile,
    ctx: &Ctx<'_>,
    tls: &TlsSettings,
) -> Result<bool, ConfigError> {
    match &raw.http3.early_data {
        Some(on) if *on.get_ref() && tls.session_cache == 0 => Err(ctx.err(
            Some(on.span()),
            "[http3] early_data needs the session cache, and tls.session_cache = 0",
            Some("a tls.session_cache of some entries (0-RTT is taken only on a session resumed from it, once), or early_data = false".to_owned()),
        )),
        Some(on) => Ok(*on.get_ref()),
        None => Ok(false),
    }
}
