//! `[[server]]` (a virtual host: names, certificates, routes, client certificates,
//! headers, tenant) and `[[stream]]` (names whose connections go to an upstream as bytes).
//! SNI chooses between them, so no name belongs to two; with none, one `localhost` server
//! serves the built-in page.

use http::header::{HeaderName, HeaderValue};
use terminus_acme::AcmeSettings;
use terminus_proxy::UpstreamSpec;
use toml::Spanned;

use crate::schema::{CertificateSection, ConfigFile, ServerSection};
use crate::{acme, client_auth, compress, headers, route, stream};
use crate::{ConfigError, Ctx, RouteConfig, StreamTarget};

/// Where a certificate pair comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertPaths {
    /// The PEM chain, leaf first.
    pub cert: std::path::PathBuf,
    /// Its private key: a PEM file, or keyless signers.
    pub key: crate::KeySource,
    /// Line of the `[[server.certificate]]` entry, for errors.
    pub line: Option<usize>,
}

/// One virtual host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// `names`: exact names or one leading wildcard label.
    pub names: Vec<String>,
    /// `default = true`: it answers unknown or missing SNI.
    pub default: bool,
    /// Longest prefix first once built; none: the built-in page.
    pub routes: Vec<RouteConfig>,
    /// Empty: the self-signed default certificates (or, with `acme`, until ACME's are
    /// stored).
    pub certificates: Vec<CertPaths>,
    /// `certificates = "acme"`: RSA-2048 and ECDSA P-256 certificates from the issuer.
    pub acme: bool,
    /// `client_auth`: the client certificates its handshakes ask for.
    pub client_auth: Option<terminus_tls::ClientAuthPolicy>,
    /// The line of its `names`, for errors found when its files load.
    pub line: Option<usize>,
    /// A `[[stream]]`: its connections go to an upstream as bytes, not as HTTP.
    pub stream: Option<StreamTarget>,
    /// Headers added to every answer (`headers`), `Server` apart.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The `Server` field of every answer: `terminus`, or what `headers` says (an
    /// upstream's own replaced); None: none (`headers = { Server = "" }`).
    pub server_header: Option<HeaderValue>,
    /// The tenant whose capacity its handshakes use; None: the default tenant.
    pub tenant: Option<String>,
    /// `access`: who may send it requests (empty: everyone).
    pub access: crate::Access,
    /// `rate`: how many requests a client may make (a route's own replaces it).
    pub rate: Option<crate::RateLimit>,
    /// `precompressed`: the codings whose copies beside a file are served, preferred
    /// first (its routes' `compression` says what is compressed on the fly).
    pub precompressed: Vec<terminus_http::compress::Coding>,
    /// `error_pages`: the file served for each error status terminus answers itself.
    pub error_pages: Vec<ErrorPage>,
}

/// One of a server's `error_pages`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorPage {
    /// A 4xx or 5xx status.
    pub status: u16,
    /// The file its answers carry, read when the site loads.
    pub path: std::path::PathBuf,
    /// The line of `error_pages`, for errors found when the file loads.
    pub line: Option<usize>,
}

impl ServerConfig {
    /// The server of a file with none: `localhost`, the built-in page.
    fn builtin() -> Self {
        Self {
            names: vec!["localhost".into()],
            default: true,
            routes: Vec::new(),
            certificates: Vec::new(),
            acme: false,
            client_auth: None,
            line: None,
            stream: None,
            headers: Vec::new(),
            server_header: Some(terminus_http::SERVER_TOKEN),
            tenant: None,
            access: crate::Access::default(),
            rate: None,
            precompressed: Vec::new(),
            error_pages: Vec::new(),
        }
    }
}

/// `[[server]]`s then `[[stream]]`s. `server_tenants` is each server's tenant, in order
/// (from the tenants' resolution); `acme` the `[acme]` section, if any.
pub(crate) fn resolve(
    raw: &ConfigFile,
    upstreams: &[UpstreamSpec],
    acme: Option<&AcmeSettings>,
    server_tenants: Vec<Option<String>>,
    ctx: &Ctx<'_>,
) -> Result<Vec<ServerConfig>, ConfigError> {
    let compression = compress::resolve_section(&raw.compression, ctx)?;
    let mut servers = raw
        .server
        .iter()
        .zip(server_tenants)
        .map(|(s, tenant)| resolve_server(s, tenant, upstreams, acme, &compression, ctx))
        .collect::<Result<Vec<_>, _>>()?;
    check_names_unique(raw, ctx)?;
    if servers.iter().filter(|s| s.default).count() > 1 {
        let second = raw
            .server
            .iter()
            .filter(|s| s.default)
            .nth(1)
            .map(|s| s.names.span());
        return Err(ctx.err(second, "more than one [[server]] has default = true", None));
    }
    if servers.is_empty() {
        servers.push(ServerConfig::builtin());
    }
    for s in &raw.stream {
        let (line, certificates) =
            names_and_certificates(&s.names, &s.certificate, "[[stream]]", ctx)?;
        servers.push(ServerConfig {
            names: s.names.get_ref().clone(),
            default: false,
            certificates,
            line,
            stream: Some(stream::resolve(s, upstreams, ctx)?),
            ..ServerConfig::builtin()
        });
    }
    Ok(servers)
}

fn resolve_server(
    s: &ServerSection,
    tenant: Option<String>,
    upstreams: &[UpstreamSpec],
    acme: Option<&AcmeSettings>,
    compression: &terminus_http::compress::Compression,
    ctx: &Ctx<'_>,
) -> Result<ServerConfig, ConfigError> {
    let own = compress::resolve_codings(s.compress.as_ref(), "compress", ctx)?
        .and_then(|codings| compress::with_codings(compression, codings));
    let (line, certificates) = names_and_certificates(&s.names, &s.certificate, "[[server]]", ctx)?;
    let (headers, server_header) = match &s.headers {
        Some(table) => headers::resolve(table, ctx)?,
        None => (Vec::new(), Some(terminus_http::SERVER_TOKEN)),
    };
    let uses_acme = acme::server_uses_acme(
        s.certificates.as_ref(),
        &s.names,
        !certificates.is_empty(),
        acme,
        ctx,
    )?;
    Ok(ServerConfig {
        names: s.names.get_ref().clone(),
        default: s.default,
        routes: route::resolve_routes(
            &s.route,
            s.root.as_ref(),
            upstreams,
            (compression, own.as_ref()),
            ctx,
        )?,
        certificates,
        acme: uses_acme,
        client_auth: s
            .client_auth
            .as_ref()
            .map(|c| client_auth::resolve(c, ctx))
            .transpose()?,
        line,
        stream: None,
        headers,
        server_header,
        tenant,
        access: crate::access::resolve_access(s.access.as_ref(), ctx)?.unwrap_or_default(),
        rate: crate::rate::resolve_rate(s.rate.as_ref(), false, ctx)?.flatten(),
        precompressed: compress::resolve_codings(s.precompressed.as_ref(), "precompressed", ctx)?
            .unwrap_or_default(),
        error_pages: error_pages(s.error_pages.as_ref(), ctx)?,
    })
}

/// `error_pages = { 404 = "errors/404.html", 503 = "errors/503.html" }`: statuses 400 to
/// 599, each with a file (read, with the rest of the site's files, when it loads).
fn error_pages(
    table: Option<&Spanned<std::collections::BTreeMap<String, String>>>,
    ctx: &Ctx<'_>,
) -> Result<Vec<ErrorPage>, ConfigError> {
    let Some(table) = table else {
        return Ok(Vec::new());
    };
    let line = ctx.line_of(table.span());
    table
        .get_ref()
        .iter()
        .map(|(status, path)| {
            let status = status
                .parse::<u16>()
                .ok()
                .filter(|s| (400..=599).contains(s))
                .ok_or_else(|| {
                    ctx.err(
                        Some(table.span()),
                        format!("error_pages: {status:?} is not an error status"),
                        Some(
                            "statuses 400 to 599: error_pages = { 404 = \"errors/404.html\" }"
                                .to_owned(),
                        ),
                    )
                })?;
            Ok(ErrorPage {
                status,
                path: ctx.path(path),
                line,
            })
        })
        .collect()
}

/// Each name belongs to one `[[server]]` or `[[stream]]`: SNI picks the first that
/// names it, so a second would be silently unreachable by that name (its certificate
/// never served, its routes never asked; two ACME servers would share a certificate
/// file and each other's challenges). Names are compared as SNI compares them: case
/// and a final dot aside. A wildcard and an exact name under it (`*.example.com`,
/// `a.example.com`) are not the same name: the exact one wins, as in nginx's
/// `server_name`.
fn check_names_unique(raw: &ConfigFile, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
    let entries = (raw.server.iter().map(|s| (&s.names, "[[server]]")))
        .chain(raw.stream.iter().map(|s| (&s.names, "[[stream]]")));
    // Each name's entry (its index among the servers and streams), kind and line.
    let mut seen = std::collections::HashMap::new();
    for (i, (names, what)) in entries.enumerate() {
        let line = ctx.line_of(names.span()).unwrap_or(0);
        for name in names.get_ref() {
            let key = name.trim_end_matches('.').to_ascii_lowercase();
            match seen.get(&key) {
                Some(&(j, _, _)) if j == i => {}
                Some(&(_, first, first_line)) => {
                    return Err(ctx.err(
                        Some(names.span()),
                        format!("{name:?} is already a name of the {first} at line {first_line}"),
                        Some("SNI picks one [[server]] or [[stream]] per name: give each name to one (an exact name under another's wildcard is fine: the exact name wins)".to_owned()),
                    ));
                }
                None => {
                    seen.insert(key, (i, what, line));
                }
            }
        }
    }
    Ok(())
}

/// A `[[server]]`'s or `[[stream]]`'s names (checked) and certificates; the line of its
/// names.
fn names_and_certificates(
    names: &Spanned<Vec<String>>,
    certificate: &[CertificateSection],
    what: &str,
    ctx: &Ctx<'_>,
) -> Result<(Option<usize>, Vec<CertPaths>), ConfigError> {
    if names.get_ref().is_empty() {
        return Err(ctx.err(
            Some(names.span()),
            format!("a {what} needs at least one name"),
            Some("names = [\"example.com\", \"*.example.com\"]".to_owned()),
        ));
    }
    for name in names.get_ref() {
        ctx.name(name, names.span(), "server name")?;
        let bare = name.strip_prefix("*.").unwrap_or(name);
        if bare.is_empty() || bare.contains('*') || bare.contains(char::is_whitespace) {
            return Err(ctx.err(
                Some(names.span()),
                format!("server name {name:?} is not valid"),
                Some("use exact names or one leading wildcard label: \"*.example.com\"".to_owned()),
            ));
        }
    }
    let certificates = certificate
        .iter()
        .map(|c| {
            Ok(CertPaths {
                cert: ctx.path(c.cert.get_ref()),
                key: crate::keyless::resolve_key(&c.key, ctx)?,
                line: ctx.line_of(c.cert.span()),
            })
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    if certificates.len() > 2 {
        return Err(ctx.err(
            Some(names.span()),
            format!("a {what} takes at most two certificates (one RSA and one ECDSA)"),
            None,
        ));
    }
    Ok((ctx.line_of(names.span()), certificates))
}
