//! `[[server.route]]`: which path prefixes of a server are answered from files and which
//! go to an upstream, resolved with their lines.

use std::path::PathBuf;

use serde::Deserialize;
use terminus_proxy::UpstreamSpec;
use toml::Spanned;

use super::access::resolve_access;
use super::compress::{resolve_codings, with_codings};
use super::rate::resolve_rate;
use super::{Access, ConfigError, Ctx, RateLimit};
use terminus_http::compress::Compression;

/// A `[[server.route]]` as written: a path prefix and what answers under it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSection {
    pub path: Spanned<String>,
    pub upstream: Option<Spanned<String>>,
    pub root: Option<Spanned<String>>,
    /// `access`: allow and deny rules in place of the server's.
    pub access: Option<Spanned<Vec<Spanned<String>>>>,
    /// `rate`: requests per client in place of the server's (`"off"`: none).
    pub rate: Option<Spanned<toml::Value>>,
    /// `redirect = { to = "https://new.example{uri}", status = 301 }`.
    pub redirect: Option<Spanned<RedirectSection>>,
    /// `compress`: the route's codings in place of its server's (`[]`: none).
    pub compress: Option<Spanned<Vec<String>>>,
    /// `rewrite = "/"`: what an upstream route's path prefix becomes before the upstream
    /// sees the request.
    pub rewrite: Option<Spanned<String>>,
    /// `intercept_errors = true`: the upstream's error statuses get the server's error
    /// pages (nginx's `proxy_intercept_errors`).
    pub intercept_errors: Option<Spanned<bool>>,
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
    /// Its own `rate`, in place of its server's: `Some(None)` for none (`"off"`).
    pub rate: Option<Option<RateLimit>>,
    /// How its responses are compressed (its own `compress`, else its server's); None:
    /// not at all.
    pub compression: Option<Compression>,
    /// An upstream route's `rewrite`: the prefix the upstream sees in place of `path`.
    pub rewrite: Option<String>,
    /// An upstream route's `intercept_errors`.
    pub intercept_errors: bool,
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
        let upstream_only = |key: &str, span: std::ops::Range<usize>| {
            if matches!(target, RouteTarget::Upstream(_)) {
                Ok(())
            } else {
                Err(ctx.err(
                    Some(span),
                    format!("{key} is for a route with an upstream"),
                    None,
                ))
            }
        };
        if let Some(i) = &r.intercept_errors {
            upstream_only("intercept_errors", i.span())?;
        }
        let rewrite = match &r.rewrite {
            Some(to) => {
                upstream_only("rewrite", to.span())?;
                Some(resolve_rewrite(path, to, ctx)?)
            }
            None => None,
        };
        out.push(RouteConfig {
            rewrite,
            intercept_errors: r.intercept_errors.as_ref().is_some_and(|i| *i.get_ref()),
            path: path.clone(),
            target,
            line: ctx.line_of(r.path.span()),
            access: resolve_access(r.access.as_ref(), ctx)?,
            rate: resolve_rate(r.rate.as_ref(), true, ctx)?,
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
            rate: None,
            compression: server_compression.cloned(),
            rewrite: None,
            intercept_errors: false,
        });
    }
    Ok(out)
}

/// A route's `rewrite`: a path in normal form (what routing compares), which keeps a
/// prefix that ends a segment ending one (`/api/` to `/`, never `/api/` to `/v2`, which
/// would make `/api/x` `/v2x`), and one that does not, not ending one (`/api` to `/v2`;
/// `/` would make `/api/x` `//x`).
fn resolve_rewrite(path: &str, to: &Spanned<String>, ctx: &Ctx<'_>) -> Result<String, ConfigError> {
    let text = to.get_ref();
    // Routing's own normal form, which the rewritten path keeps: the text must come out
    // of it unchanged (no dot segments, `//`, needless or lower-case escapes, encoded
    // slashes, `..;`), and hold only what a path may.
    let normal = text.starts_with('/')
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/-._~!$&'()*+,;=:@%".contains(&b))
        && matches!(
            terminus_http::target::normalise_path(text),
            Ok(std::borrow::Cow::Borrowed(_))
        );
    if !normal {
        return Err(ctx.err(
            Some(to.span()),
            format!("rewrite {text:?} is not a path in normal form"),
            Some("a path starting with /, without . or .. segments, //, ? or spaces: rewrite = \"/v2/\"".to_owned()),
        ));
    }
    if path.ends_with('/') != text.ends_with('/') {
        return Err(ctx.err(
            Some(to.span()),
            format!("rewrite {text:?} and the route's path {path:?} must both end with / or neither"),
            Some(
                "path = \"/api/\" with rewrite = \"/\" or \"/v2/\"; path = \"/api\" with rewrite = \"/v2\""
                    .to_owned(),
            ),
        ));
    }
    Ok(text.clone())
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

    #[test]
    fn a_rewrite_is_a_normal_path_for_an_upstream_route_ending_as_its_path_ends() {
        let route = |path: &str, more: &str| {
            let text = format!("[[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:8081\"]\n[[server]]\nnames = [\"x\"]\n[[server.route]]\npath = \"{path}\"\n{more}\n");
            Config::parse(&text, "t.toml", &Overrides::default())
        };
        let c = route(
            "/api/",
            "upstream = \"app\"\nrewrite = \"/\"\nintercept_errors = true",
        )
        .unwrap();
        assert_eq!(c.servers[0].routes[0].rewrite.as_deref(), Some("/"));
        assert!(c.servers[0].routes[0].intercept_errors);
        let c = route("/api", "upstream = \"app\"\nrewrite = \"/v2\"").unwrap();
        assert_eq!(c.servers[0].routes[0].rewrite.as_deref(), Some("/v2"));
        assert!(!c.servers[0].routes[0].intercept_errors);
        for (path, more, says) in [
            (
                "/api/",
                "upstream = \"app\"\nrewrite = \"/v2\"",
                "end with /",
            ),
            ("/api", "upstream = \"app\"\nrewrite = \"/\"", "end with /"),
            (
                "/api/",
                "upstream = \"app\"\nrewrite = \"v2/\"",
                "normal form",
            ),
            (
                "/api/",
                "upstream = \"app\"\nrewrite = \"/a/../b/\"",
                "normal form",
            ),
            (
                "/api/",
                "upstream = \"app\"\nrewrite = \"/a//b/\"",
                "normal form",
            ),
            (
                "/api/",
                "upstream = \"app\"\nrewrite = \"/a?b/\"",
                "normal form",
            ),
            (
                "/api/",
                "upstream = \"app\"\nrewrite = \"/a/%2e%2e/\"",
                "normal form",
            ),
            (
                "/api/",
                "upstream = \"app\"\nrewrite = \"/a/..;/\"",
                "normal form",
            ),
            (
                "/api/",
                "upstream = \"app\"\nrewrite = \"/a%2Fb/\"",
                "normal form",
            ),
            (
                "/api/",
                "upstream = \"app\"\nrewrite = \"/a%zz/\"",
                "normal form",
            ),
            (
                "/api/",
                "upstream = \"app\"\nrewrite = \"/a%7e/\"",
                "normal form",
            ),
            ("/api/", "root = \"/srv\"\nrewrite = \"/\"", "upstream"),
            (
                "/api/",
                "root = \"/srv\"\nintercept_errors = true",
                "upstream",
            ),
        ] {
            let e = route(path, more).unwrap_err();
            assert_eq!(e.line, Some(9), "{more}: {e}");
            assert!(e.to_string().contains(says), "{more}: {e}");
        }
    }
}
