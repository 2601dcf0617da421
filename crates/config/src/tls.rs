//! `[tls]`: protocol versions, cipher suites and groups as rustls values, session
//! resumption, and how the session-ticket keys rotate. A name rustls does not have, an
//! empty list, or a list that leaves a version without a suite is refused at its line.

use terminus_fleet::tickets::Rotation;
use terminus_tls::{TlsSettings, TlsSettingsError};
use toml::Spanned;

use crate::schema::{parse_duration, ConfigFile};
use crate::{ConfigError, Ctx};

/// `[tls]` as rustls values. A name rustls does not have, an empty list, or suites of
/// none of the versions is refused here, at its line.
pub(crate) fn resolve(raw: &ConfigFile, ctx: &Ctx<'_>) -> Result<TlsSettings, ConfigError> {
    fn list<T>(
        ctx: &Ctx<'_>,
        value: &Option<Spanned<Vec<String>>>,
        key: &str,
        hint: &str,
        parse: impl Fn(&str) -> Result<T, TlsSettingsError>,
    ) -> Result<Option<Vec<T>>, ConfigError> {
        let Some(v) = value else { return Ok(None) };
        if v.get_ref().is_empty() {
            return Err(ctx.err(
                Some(v.span()),
                format!("tls.{key} is empty"),
                Some(hint.to_owned()),
            ));
        }
        let parsed = v
            .get_ref()
            .iter()
            .map(|name| parse(name))
            .collect::<Result<_, _>>()
            .map_err(|e| {
                ctx.err(
                    Some(v.span()),
                    format!("tls.{key}: {e}"),
                    Some(hint.to_owned()),
                )
            })?;
        Ok(Some(parsed))
    }
    let t = &raw.tls;
    let mut tls = TlsSettings::default();
    if let Some(v) = list(
        ctx,
        &t.versions,
        "versions",
        "e.g. [\"1.2\", \"1.3\"]",
        TlsSettings::version_from_name,
    )? {
        tls.versions = v;
    }
    if let Some(s) = list(
        ctx,
        &t.cipher_suites,
        "cipher_suites",
        "leave it out for rustls's defaults",
        TlsSettings::suite_from_name,
    )? {
        tls.cipher_suites = s;
    }
    if let Some(g) = list(
        ctx,
        &t.groups,
        "groups",
        "e.g. [\"x25519mlkem768\", \"x25519\", \"secp256r1\"]",
        TlsSettings::group_from_name,
    )? {
        tls.groups = g;
    }
    if let Err(e) = tls.check() {
        let (at, hint) = match e {
            TlsSettingsError::NoTls12Group => (&t.groups, None),
            _ => (
                &t.cipher_suites,
                Some("add a suite of each version in tls.versions".to_owned()),
            ),
        };
        let at = at.as_ref().or(t.versions.as_ref()).map(|v| v.span());
        return Err(ctx.err(at, e.to_string(), hint));
    }
    tls.session_tickets = t.session_tickets.unwrap_or(true);
    tls.session_cache = t.session_cache.unwrap_or(256 * 1024);
    tls.prefer_server_ciphers = t.prefer_server_ciphers.unwrap_or(true);
    Ok(tls)
}

/// `tls.ticket_keys`: how the session-ticket keys rotate.
pub(crate) fn ticket_keys(raw: &ConfigFile, ctx: &Ctx<'_>) -> Result<Rotation, ConfigError> {
    let Some(section) = &raw.tls.ticket_keys else {
        return Ok(Rotation::default());
    };
    let t = section.get_ref();
    let mut rotation = Rotation::default();
    if let Some(rotate) = &t.rotate {
        rotation.rotate = parse_duration(rotate).ok_or_else(|| {
            ctx.err(
                Some(section.span()),
                format!("tls.ticket_keys rotate = {rotate:?} is not a duration"),
                Some("write it like \"6h\", \"30m\" or \"2s\"".to_owned()),
            )
        })?;
    }
    if let Some(keep) = t.keep {
        rotation.keep = keep;
    }
    rotation.check().map_err(|e| {
        ctx.err(
            Some(section.span()),
            format!("tls.ticket_keys: {e}"),
            Some("e.g. ticket_keys = { rotate = \"6h\", keep = 2 }".to_owned()),
        )
    })?;
    Ok(rotation)
}
