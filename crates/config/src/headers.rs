//! `[[server]] headers`: response headers a server adds to every answer (nginx
//! `add_header ... always`), e.g. Strict-Transport-Security or X-Content-Type-Options.
//! Checked when the file is read: names and values must be valid, headers that frame the
//! message or belong to one connection are refused, and Strict-Transport-Security must be
//! what RFC 6797 defines (a browser keeps it for max-age, so a typo must not ship).
//!
//! `Server` is not added but replaces terminus's own token (an upstream's too), and
//! `Server = ""` sends none (nginx `server_tokens`, Caddy `header -Server`).

use std::collections::BTreeMap;

use http::header::{self, HeaderName, HeaderValue};
use toml::Spanned;

use super::{ConfigError, Ctx};

/// Headers the connection itself writes or that describe one hop, never a site's choice.
const REFUSED: [HeaderName; 7] = [
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::CONNECTION,
    header::UPGRADE,
    header::TRAILER,
    header::TE,
    header::DATE,
];

/// Headers added to answers, in order.
pub(super) type Added = Vec<(HeaderName, HeaderValue)>;

/// A server's `headers`: those added to its answers, in the file's order of names, and
/// its `Server` (None: no `Server` field at all); or an error at the table's line.
pub(super) fn resolve(
    table: &Spanned<BTreeMap<String, String>>,
    ctx: &Ctx<'_>,
) -> Result<(Added, Option<HeaderValue>), ConfigError> {
    let at = || Some(table.span());
    let mut headers = Vec::new();
    let mut server = Some(terminus_http::SERVER_TOKEN);
    for (name, value) in table.get_ref() {
        let Ok(parsed) = HeaderName::from_bytes(name.as_bytes()) else {
            return Err(ctx.err(
                at(),
                format!("headers: {name:?} is not a header name"),
                None,
            ));
        };
        if REFUSED.contains(&parsed) || name.eq_ignore_ascii_case("keep-alive") {
            return Err(ctx.err(
                at(),
                format!("headers: {name} is written by the connection, not configured"),
                None,
            ));
        }
        if parsed == header::STRICT_TRANSPORT_SECURITY {
            strict_transport_security(value).map_err(|why| {
                let hint =
                    "e.g. \"Strict-Transport-Security\" = \"max-age=31536000; includeSubDomains\"";
                ctx.err(
                    at(),
                    format!("headers: Strict-Transport-Security: {why}"),
                    Some(hint.to_owned()),
                )
            })?;
        }
        let Ok(value) = HeaderValue::from_str(value.trim()) else {
            return Err(ctx.err(
                at(),
                format!("headers: the value of {name} is not a valid header value"),
                None,
            ));
        };
        if parsed == header::SERVER {
            server = (!value.is_empty()).then_some(value);
        } else {
            headers.push((parsed, value));
        }
    }
    Ok((headers, server))
}

/// RFC 6797 section 6.1: `max-age` (required, seconds), `includeSubDomains`; `preload`
/// is the browsers' preload-list convention.
fn strict_transport_security(value: &str) -> Result<(), String> {
    let mut max_age = false;
    for directive in value.split(';').map(str::trim).filter(|d| !d.is_empty()) {
        match directive.split_once('=') {
            Some((name, seconds)) if name.trim().eq_ignore_ascii_case("max-age") => {
                if seconds.trim().trim_matches('"').parse::<u64>().is_err() {
                    return Err(format!(
                        "max-age must be a number of seconds, not {seconds:?}"
                    ));
                }
                max_age = true;
            }
            None if directive.eq_ignore_ascii_case("includeSubDomains")
                || directive.eq_ignore_ascii_case("preload") => {}
            _ => {
                return Err(format!(
                    "unknown directive {directive:?} (max-age, includeSubDomains, preload)"
                ))
            }
        }
    }
    if max_age {
        Ok(())
    } else {
        Err("max-age is required".to_owned())
    }
}
