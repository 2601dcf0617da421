//! `[[server.route]]`: which path prefixes of a server are answered from files and which
//! go to an upstream, resolved with their lines.

use std::path::PathBuf;

use serde::Deserialize;
use terminus_proxy::UpstreamSpec;
use toml::Spanned;

use super::access::resolve_access;
use super::compress::{resolve_codings, with_codings};
use super::{Access, ConfigError, Ctx};
use terminus_http::compress::Compression;

/// A `[[server.route]]` as written: a path prefix and what answers under it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSection {
    pub path: Spanned<String>,
    pub upstream: Option<Spanned<String>>,
    pub root: Option<Spanned<String>>,
    /// `access`: allow and deny rules in place of the server's.
    pub access: Option<Spanned<Vec<String>>>,
    /// `redirect = { to = "https://new.example{uri}", status = 301 }`.
    pub redirect: Option<Spanned<RedirectSection>>,
    /// `compress`: the route's codings in place of its server's (`[]`: none).
    pub compress: Option<Spanned<Vec<String>>>,
}

/// A route's `redirect` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedirectSection {
    pub to: String,
    pub status: Option<u16>,
}

/// The placeholders a redirect's `to` may hold, each replaced by the request's.
pub const REDIRECT_PLACEHOLDERS: [&str; 4] = ["{uri}", "{path}", "{query}", "{host}"];

/// What answers the requests under a path prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteTarget {
    /// Files from this directory.
    Root(PathBuf),
    /// The `[[upstream]]` of this name.
    Upstream(String),
    /// A redirect to `to` (its placeholders filled in) with `status`.
    Redirect {
        /// The URL or path, with placeholders.
        to: String,
        /// 301, 302, 303, 307 or 308.
        status: u16,
    },
}

/// One route of a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteConfig {
    /// The path prefix it answers under (`/` for all).
    pub path: String,
    /// What answers.
    pub target: RouteTarget,
    /// The line of its `path` (or of `root`), for errors found when it loads.
    pub line: Option<usize>,
    /// Its own `access` rules, in place of its server's.
    pub access: Option<Access>,
    /// How its responses are compressed (its own `compress`, else its server's); None:
    /// not at all.
    pub compression: Option<Compression>,
}

/// A server's routes: `root` is the route "/" when no `[[server.route]]` says otherwise.
/// `compression` is the server's, which a route without its own `compress` keeps.
pub(super) fn resolve_routes(
    routes: &[RouteSection],
    root: Option<&Spanned<String>>,
    upstreams: &[UpstreamSpec],
    compression: (&Compression, Option<&Compression>),
    ctx: &Ctx<'_>,
) -> Result<Vec<RouteConfig>, ConfigError> {
    let (section, server_compression) = compression;
    let mut out = Vec::new();
    for r in routes {
        let path = r.path.get_ref();
        if !path.starts_with('/') {
            return Err(ctx.err(
                Some(r.path.span()),
                format!("route path {path:?} does not start with /"),
                Some("a route matches by path prefix: \"/api/\"".to_owned()),
            ));
        }
        if out.iter().any(|o: &RouteConfig| &o.path == path) {
            return Err(ctx.err(
                Some(r.path.span()),
                format!("two routes for {path:?}"),
                None,
            ));
        }
        let target = match (&r.upstream, &r.root, &r.redirect) {
            (None, None, Some(redirect)) => resolve_redirect(redirect, ctx)?,
            (Some(u), None, None) => {
                if !upstreams.iter().any(|s| &s.name == u.get_ref()) {
                    return Err(ctx.err(
                        Some(u.span()),
                        format!("no [[upstream]] is named {:?}", u.get_ref()),
                        Some("define it: [[upstream]] name = ... servers = [...]".to_owned()),
                    ));
                }
                RouteTarget::Upstream(u.get_ref().clone())
            }
            (None, Some(root), None) => RouteTarget::Root(ctx.path(root.get_ref())),
            _ => {
                return Err(ctx.err(
                    Some(r.path.span()),
                    format!("route {path:?} needs one of upstream, root or redirect"),
                    None,
                ))
            }
        };
        out.push(RouteConfig {
            path: path.clone(),
            target,
            line: ctx.line_of(r.path.span()),
            access: resolve_access(r.access.as_ref(), ctx)?,
            compression: match resolve_codings(r.compress.as_ref(), "compress", ctx)? {
                Some(codings) => with_codings(section, codings),
                None => server_compression.cloned(),
            },
        });
    }
    if let Some(root) = root {
        if out.iter().any(|r| r.path == "/") {
            return Err(ctx.err(
                Some(root.span()),
                "root and a [[server.route]] for \"/\" both say what serves \"/\"",
                Some("keep one of them".to_owned()),
            ));
        }
        out.push(RouteConfig {
            path: "/".into(),
            target: RouteTarget::Root(ctx.path(root.get_ref())),
            line: ctx.line_of(root.span()),
            access: None,
            compression: server_compression.cloned(),
        });
    }
    Ok(out)
}

/// A `redirect`: a `to` of known placeholders, a redirecting status (302 unless given).
fn resolve_redirect(
    redirect: &Spanned<RedirectSection>,
    ctx: &Ctx<'_>,
) -> Result<RouteTarget, ConfigError> {
    let RedirectSection { to, status } = redirect.get_ref();
    let status = status.unwrap_or(302);
    if ![301, 302, 303, 307, 308].contains(&status) {
        return Err(ctx.err(
            Some(redirect.span()),
            format!("redirect status {status} is not a redirect"),
            Some("301, 302, 303, 307 or 308 (307 and 308 keep the method and body)".to_owned()),
        ));
    }
    let mut rest = to.as_str();
    while let Some(open) = rest.find('{') {
        let known = REDIRECT_PLACEHOLDERS
            .iter()
            .find(|p| rest[open..].starts_with(**p));
        let Some(placeholder) = known else {
            return Err(ctx.err(
                Some(redirect.span()),
                format!("redirect to {to:?} has a placeholder terminus does not know"),
                Some(format!("use {}", REDIRECT_PLACEHOLDERS.join(", "))),
            ));
        };
        rest = &rest[open + placeholder.len()..];
    }
    let valid = !to.is_empty() && to.bytes().all(|b| b.is_ascii_graphic());
    if !valid {
        return Err(ctx.err(
            Some(redirect.span()),
            format!("redirect to {to:?} is not a URL a Location header can carry"),
            Some(
                "an absolute URL or a path, without spaces: \"https://new.example{uri}\""
                    .to_owned(),
            ),
        ));
    }
    Ok(RouteTarget::Redirect {
        to: to.clone(),
        status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, Overrides};

    #[test]
    fn a_redirect_needs_a_redirecting_status_and_known_placeholders() {
        let route = |redirect: &str| {
            let text = format!("[[server]]\nnames = [\"x\"]\n[[server.route]]\npath = \"/a/\"\nredirect = {redirect}\n");
            Config::parse(&text, "t.toml", &Overrides::default())
        };
        let c = route("{ to = \"https://b.example{uri}\" }").unwrap();
        assert_eq!(
            c.servers[0].routes[0].target,
            RouteTarget::Redirect {
                to: "https://b.example{uri}".into(),
                status: 302
            }
        );
        for (bad, says) in [
            ("{ to = \"/b\", status = 200 }", "not a redirect"),
            ("{ to = \"/b{request_uri}\" }", "placeholder"),
            ("{ to = \"/b c\" }", "Location"),
            ("{ to = \"/b\", code = 301 }", "code"),
        ] {
            let e = route(bad).unwrap_err();
            assert_eq!(e.line, Some(5), "{bad}: {e}");
            assert!(e.to_string().contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn routes_take_an_upstream_or_a_root_and_root_is_the_slash_route() {
        let c = Config::parse(
            "[[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:8081\"]\n[[server]]\nnames = [\"x\"]\nroot = \"/srv\"\n[[server.route]]\npath = \"/api/\"\nupstream = \"app\"\n",
            "t.toml",
            &Overrides::default(),
        )
        .unwrap();
        let routes: Vec<(&str, &RouteTarget)> = c.servers[0]
            .routes
            .iter()
            .map(|r| (r.path.as_str(), &r.target))
            .collect();
        assert_eq!(
            routes,
            [
                ("/api/", &RouteTarget::Upstream("app".into())),
                ("/", &RouteTarget::Root("/srv".into()))
            ]
        );
    }
}
