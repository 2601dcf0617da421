//! `[fleet]`: the store (Redis) the instances of a fleet share their session-ticket keys
//! and tenant use through, and the files that open it (read at start, not here).

use terminus_fleet::store::StoreSettings;
use terminus_fleet::tickets::Rotation;

use crate::schema::{parse_duration, ConfigFile};
use crate::{ConfigError, Ctx};

/// `[fleet]`: where the store is and the files that open it (read at start).
pub(crate) fn resolve(
    raw: &ConfigFile,
    ctx: &Ctx<'_>,
    rotation: Rotation,
) -> Result<Option<StoreSettings>, ConfigError> {
    let Some(section) = &raw.fleet else {
        return Ok(None);
    };
    let f = section.get_ref();
    let at = Some(section.span());
    let Some(url) = &f.store else {
        return Err(ctx.err(
            at,
            "[fleet] needs store",
            Some("store = \"redis://127.0.0.1:6379/0\" (or rediss:// for TLS)".to_owned()),
        ));
    };
    if let Err(e) = StoreSettings::check_url(url) {
        return Err(ctx.err(
            at,
            format!("[fleet] {e}"),
            Some("store = \"redis://HOST:PORT/DB\"".to_owned()),
        ));
    }
    let Some(key_file) = &f.key_file else {
        return Err(ctx.err(
            at,
            "[fleet] needs key_file: ticket keys are kept in the store wrapped under it",
            Some(
                "make one with `openssl rand -hex 32 > fleet.key`, the same file on every instance"
                    .to_owned(),
            ),
        ));
    };
    let poll = match &f.poll {
        None => StoreSettings::POLL,
        Some(p) => parse_duration(p).filter(|d| !d.is_zero()).ok_or_else(|| {
            ctx.err(
                Some(section.span()),
                format!("[fleet] poll = {p:?} is not a duration"),
                Some("e.g. poll = \"1s\"".to_owned()),
            )
        })?,
    };
    if poll * 4 > rotation.rotate {
        return Err(ctx.err(
            at.clone(),
            format!(
                "[fleet] poll ({poll:?}) is more than a quarter of tls.ticket_keys rotate ({:?}): the next period's key would not reach every instance before it seals",
                rotation.rotate
            ),
            Some("poll = \"1s\" (the default) with rotate of 4s or more".to_owned()),
        ));
    }
    if f.ca.is_some() && !url.starts_with("rediss://") {
        return Err(ctx.err(at, "[fleet] ca is for a rediss:// (TLS) store", None));
    }
    Ok(Some(StoreSettings {
        url: url.clone(),
        key_file: ctx.path(key_file),
        password_file: f.password_file.as_deref().map(|p| ctx.path(p)),
        ca: f.ca.as_deref().map(|p| ctx.path(p)),
        prefix: f
            .prefix
            .clone()
            .unwrap_or_else(|| StoreSettings::PREFIX.to_owned()),
        poll,
    }))
}
