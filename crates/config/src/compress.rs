//! Response compression: `[compression]` (sizes, types and levels, for every server) and
//! the lists that turn it on, a server's `compress` (codings made on the fly, preferred
//! first; a route's own list replaces it, `[]` turning it off) and `precompressed` (the
//! codings whose copies are looked for beside a file). Off unless a server asks, as
//! nginx's `gzip` and Caddy's `encode` are.

use serde::Deserialize;
use terminus_http::compress::{Coding, Compression, Levels, DEFAULT_TYPES};
use toml::Spanned;

use super::{ConfigError, Ctx};

/// The `[compression]` section as written: every key has a default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompressionSection {
    /// Responses shorter than this many bytes are sent as they are.
    pub min_length: Option<Spanned<u64>>,
    /// Compressible media types.
    pub types: Option<Spanned<Vec<String>>>,
    pub gzip_level: Option<Spanned<u32>>,
    pub brotli_level: Option<Spanned<u32>>,
    pub zstd_level: Option<Spanned<i32>>,
}

/// Responses under 512 bytes gain little (Caddy's `minimum_length`).
const DEFAULT_MIN_LENGTH: u64 = 512;

/// The levels bench/compress chose for CPU per byte saved: gzip 2 (zlib-rs's level 1 is
/// zlib-ng's "quick" strategy, whose output was 23 % larger than nginx's level 1; level 2
/// was cheaper and smaller than nginx's level 1), brotli 3 and zstd 3 (zstd's default).
const DEFAULT_LEVELS: Levels = Levels {
    gzip: 2,
    brotli: 3,
    zstd: 3,
};

/// `[compression]` resolved, with no codings: a server's `compress` list adds them.
pub(crate) fn resolve_section(
    raw: &CompressionSection,
    ctx: &Ctx<'_>,
) -> Result<Compression, ConfigError> {
    let level = |v: &Option<Spanned<u32>>, range: std::ops::RangeInclusive<u32>, name, default| {
        match v {
            None => Ok(default),
            Some(l) if range.contains(l.get_ref()) => Ok(*l.get_ref()),
            Some(l) => Err(ctx.err(
                Some(l.span()),
                format!("{name} {} is out of range", l.get_ref()),
                Some(format!(
                    "{name} is {} to {} (lower is faster; higher levels are for copies made ahead: precompressed)",
                    range.start(),
                    range.end()
                )),
            )),
        }
    };
    let zstd = match &raw.zstd_level {
        None => DEFAULT_LEVELS.zstd,
        Some(l) if (-7..=9).contains(l.get_ref()) && *l.get_ref() != 0 => *l.get_ref(),
        Some(l) => {
            return Err(ctx.err(
                Some(l.span()),
                format!("zstd_level {} is out of range", l.get_ref()),
                Some("zstd_level is 1 to 9, or -7 to -1 for faster still (higher levels are for copies made ahead: precompressed)".to_owned()),
            ))
        }
    };
    let types = match &raw.types {
        None => DEFAULT_TYPES.iter().map(|t| t.to_string()).collect(),
        Some(list) => {
            for t in list.get_ref() {
                let valid = t.split_once('/').is_some_and(|(kind, sub)| {
                    !kind.is_empty()
                        && !sub.is_empty()
                        && !kind.contains('*')
                        && (sub == "*" || !sub.contains('*'))
                        && t.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"/*+-.".contains(&b))
                });
                if !valid {
                    return Err(ctx.err(
                        Some(list.span()),
                        format!("{t:?} is not a media type"),
                        Some("a type/subtype, or type/* for all of a type: \"text/*\", \"application/json\"".to_owned()),
                    ));
                }
            }
            list.get_ref().clone()
        }
    };
    Ok(Compression {
        codings: Vec::new(),
        min_length: raw
            .min_length
            .as_ref()
            .map_or(DEFAULT_MIN_LENGTH, |m| *m.get_ref()),
        types,
        levels: Levels {
            gzip: level(&raw.gzip_level, 1..=9, "gzip_level", DEFAULT_LEVELS.gzip)?,
            brotli: level(
                &raw.brotli_level,
                0..=6,
                "brotli_level",
                DEFAULT_LEVELS.brotli,
            )?,
            zstd,
        },
    })
}

/// A `compress` or `precompressed` list: known codings, each once.
pub(crate) fn resolve_codings(
    list: Option<&Spanned<Vec<String>>>,
    key: &str,
    ctx: &Ctx<'_>,
) -> Result<Option<Vec<Coding>>, ConfigError> {
    let Some(list) = list else {
        return Ok(None);
    };
    let mut out = Vec::new();
    for name in list.get_ref() {
        let Some(coding) = Coding::from_name(name) else {
            return Err(ctx.err(
                Some(list.span()),
                format!("{key}: {name:?} is not a coding terminus makes"),
                Some(format!(
                    "{key} = [\"zstd\", \"br\", \"gzip\"], in the order preferred"
                )),
            ));
        };
        if out.contains(&coding) {
            return Err(ctx.err(
                Some(list.span()),
                format!("{key}: {name:?} is named twice"),
                None,
            ));
        }
        out.push(coding);
    }
    Ok(Some(out))
}

/// The compression of a server's or route's `compress` list: `None` for none or `[]`.
pub(crate) fn with_codings(section: &Compression, codings: Vec<Coding>) -> Option<Compression> {
    (!codings.is_empty()).then(|| Compression {
        codings,
        ..section.clone()
    })
}

#[cfg(test)]
mod tests {
    use crate::{Config, Overrides};
    use terminus_http::compress::Coding;

    fn parse(text: &str) -> Result<Config, crate::ConfigError> {
        Config::parse(text, "t.toml", &Overrides::default())
    }

    #[test]
    fn compress_lists_turn_it_on_per_server_and_a_route_can_turn_it_off() {
        let c = parse(
            "[compression]\nmin_length = 100\nzstd_level = -1\n[[server]]\nnames = [\"x\"]\nroot = \"/srv\"\ncompress = [\"gzip\", \"brotli\"]\nprecompressed = [\"br\", \"gzip\"]\n[[server.route]]\npath = \"/account/\"\nroot = \"/srv\"\ncompress = []\n[[server.route]]\npath = \"/feed/\"\nroot = \"/srv\"\ncompress = [\"zstd\"]\n",
        )
        .unwrap();
        let s = &c.servers[0];
        assert_eq!(s.precompressed, [Coding::Brotli, Coding::Gzip]);
        let route = |p: &str| s.routes.iter().find(|r| r.path == p).unwrap();
        assert_eq!(route("/account/").compression, None);
        let feed = route("/feed/").compression.clone().unwrap();
        assert_eq!(feed.codings, [Coding::Zstd]);
        assert_eq!((feed.min_length, feed.levels.zstd), (100, -1));
        let all = route("/").compression.clone().unwrap();
        assert_eq!(all.codings, [Coding::Gzip, Coding::Brotli]);
        assert_eq!(all.levels.gzip, 2);
        // Off unless asked.
        let off = parse("[[server]]\nnames = [\"x\"]\nroot = \"/srv\"\n").unwrap();
        assert_eq!(off.servers[0].routes[0].compression, None);
        assert!(off.servers[0].precompressed.is_empty());
    }

    #[test]
    fn bad_compression_is_refused_at_its_line() {
        for (text, line, says) in [
            (
                "[[server]]\nnames = [\"x\"]\n\ncompress = [\"deflate\"]\n",
                4,
                "deflate",
            ),
            (
                "[[server]]\nnames = [\"x\"]\n\ncompress = [\"gzip\", \"gzip\"]\n",
                4,
                "twice",
            ),
            (
                "[[server]]\nnames = [\"x\"]\nprecompressed = [\"lzma\"]\n",
                3,
                "lzma",
            ),
            ("[compression]\ngzip_level = 0\n", 2, "gzip_level"),
            ("[compression]\n\nbrotli_level = 7\n", 3, "brotli_level"),
            ("[compression]\nzstd_level = 10\n", 2, "zstd_level"),
            ("[compression]\nzstd_level = 0\n", 2, "zstd_level"),
            ("[compression]\ntypes = [\"text\"]\n", 2, "media type"),
            ("[compression]\ntypes = [\"*/html\"]\n", 2, "media type"),
            ("[compression]\nlevel = 3\n", 2, "level"),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, Some(line), "{text}: {e}");
            assert!(e.to_string().contains(says), "{text}: {e}");
        }
    }
}
