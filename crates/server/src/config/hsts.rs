//! `[[server]] hsts`: the Strict-Transport-Security header (RFC 6797) a server sends with
//! every answer, checked when the file is read. Off unless set: once a browser has seen
//! the header it refuses plain HTTP to the name for max-age, which an operator must mean.

use hyper::header::HeaderValue;
use toml::Spanned;

use super::{ConfigError, Ctx};

/// The header value, or an error at the value's line.
pub(super) fn resolve(value: &Spanned<String>, ctx: &Ctx<'_>) -> Result<HeaderValue, ConfigError> {
    let text = value.get_ref().trim();
    let hint = || Some("e.g. hsts = \"max-age=31536000; includeSubDomains\"".to_owned());
    let mut max_age = None;
    for directive in text.split(';').map(str::trim).filter(|d| !d.is_empty()) {
        match directive.split_once('=') {
            Some((name, seconds)) if name.eq_ignore_ascii_case("max-age") => {
                max_age = seconds.trim_matches('"').parse::<u64>().ok();
                if max_age.is_none() {
                    let message =
                        format!("hsts: max-age must be a number of seconds, not {seconds:?}");
                    return Err(ctx.err(Some(value.span()), message, hint()));
                }
            }
            None if directive.eq_ignore_ascii_case("includeSubDomains")
                || directive.eq_ignore_ascii_case("preload") => {}
            _ => {
                let message = format!(
                    "hsts: unknown directive {directive:?} (max-age, includeSubDomains, preload)"
                );
                return Err(ctx.err(Some(value.span()), message, hint()));
            }
        }
    }
    if max_age.is_none() {
        return Err(ctx.err(Some(value.span()), "hsts: max-age is required", hint()));
    }
    HeaderValue::from_str(text)
        .map_err(|_| ctx.err(Some(value.span()), "hsts: not a valid header value", hint()))
}
