//! The live, reloadable state built from a [`Config`]: TLS configuration, virtual hosts,
//! docroots, timeouts. A SIGHUP builds a new [`Site`] and swaps it in; connections keep
//! the one they were accepted with.

use std::sync::{Arc, RwLock};
use std::time::Duration;
use terminus_fleet::tickets::Ticketer;

use terminus_admission::clients::Clients;
use terminus_admission::tenant::{TenantAccount, Tenants};
use terminus_engine::SigningKeyPair;
use terminus_proxy::stream::StreamMode;
use terminus_proxy::{ProxyMetrics, Upstream};
use terminus_tls::{LoadedCert, SniResolver, VirtualHostCerts};

use crate::app::error_pages::ErrorPages;
use crate::app::limits::RateRule;
use crate::app::route::{Entry, Rewrite, Route, Routes};
use crate::logs::{self, AccessLog};
use terminus_config::{
    Config, ConfigError, KeySource, RemoteKeyConfig, RouteTarget, DEFAULT_TENANT,
};
use terminus_http::files::{Caching, DocRoot};

#[derive(Debug)]
pub struct Host {
    pub names: Vec<String>,
    /// The rustls configuration its handshakes use: the site's, or the one of its
    /// client-certificate policy.
    pub tls: Arc<rustls::ServerConfig>,
    /// `client_auth`'s mode, where it asks for client certificates.
    pub client_auth: Option<terminus_tls::ClientAuthMode>,
    /// Where it asks for client certificates: what its policy's CRLs revoke, read with
    /// the verifier of `tls`. A resumed session's restored chain is checked against it
    /// (rustls verifies nothing on resumption).
    pub revocations: Option<Arc<terminus_tls::Revocations>>,
    pub routes: Routes,
    /// A `[[stream]]`'s upstream and mode: its connections carry bytes, not HTTP.
    pub stream: Option<(Arc<Upstream>, StreamMode)>,
    /// Headers added to every answer (`[[server]] headers`).
    pub headers: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>,
    /// Every answer's `Server` field and its error pages' last line (`headers = {
    /// Server = ... }`).
    pub token: terminus_http::ServerToken,
    /// Whose crypto capacity its handshakes use.
    pub tenant: Arc<TenantAccount>,
    /// Who may send it requests (`[[server]] access`; a route's own rules replace it).
    pub access: terminus_config::Access,
    /// How many requests a client may make (`[[server]] rate`; a route's own replaces it).
    pub rate: Option<RateRule>,
    /// The codings whose copies beside a file its file routes serve, preferred first.
    pub precompressed: Vec<terminus_http::compress::Coding>,
    /// Its pages for the errors it answers itself (`error_pages`).
    pub error_pages: ErrorPages,
}

impl Host {
    /// Its first exact name: a wildcard is a pattern, no one host's name.
    pub fn first_exact_name(&self) -> Option<&str> {
        self.names
            .iter()
            .find(|n| !n.starts_with("*."))
            .map(String::as_str)
    }
}

/// A connection's timeouts: its handshake's, then HTTP's.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// The TLS handshake, from the first byte.
    pub handshake: Duration,
    /// Reading requests and between them.
    pub http: terminus_http::Timeouts,
}

/// Everything a connection needs, fixed for its lifetime.
pub struct Site {
    pub tls: Arc<rustls::ServerConfig>,
    /// The same without ALPN, for `[[stream]]`s: a stream is not HTTP, so no HTTP
    /// protocol is agreed on for it.
    pub stream_tls: Arc<rustls::ServerConfig>,
    /// The versions both are built with (rustls does not tell), for the checks it leaves
    /// to the server (`ClientHelloRead::refuse_downgrade`).
    pub tls_versions: Vec<rustls::ProtocolVersion>,
    /// Whether a client can resume a session (tickets or the session cache are on).
    pub resumption: bool,
    /// Whether some host's tenant has a quota: a connection not read yet may then be a
    /// handshake within its tenant's committed rate, which admission control takes on
    /// beyond a flood of other tenants' handshakes (`terminus_admission::bound`).
    pub quotas: bool,
    pub resolver: Arc<SniResolver>,
    pub hosts: Vec<Host>,
    pub timeouts: Timeouts,
    pub access_log: Option<AccessLog>,
    /// The open-file cache's settings (each worker keeps its own cache).
    pub files: Caching,
    /// (names, key type, SHA-256 fingerprint) of every certificate, for the start-up log.
    pub certificates: Vec<(String, &'static str, String)>,
    /// Every certificate's private key, for measuring what signing with it costs.
    pub signing_keys: Vec<Arc<SigningKeyPair>>,
    /// The reverse proxy's upstreams (routes hold them too).
    pub upstreams: Vec<Arc<Upstream>>,
    /// The per-client limits' counts (kept across reloads), which `rate`s are asked of.
    pub clients: Arc<Clients>,
    /// `limits.connections_per_client`.
    pub connections_per_client: Option<u32>,
}

/// What every [`Site`] is built with besides its configuration: the process's own state,
/// which a reload keeps.
#[derive(Clone, Copy)]
pub struct Kept<'a> {
    /// Certificates made at start for the servers that name none.
    pub self_signed: &'a [LoadedCert],
    pub proxy_metrics: &'a ProxyMetrics,
    pub tenants: &'a Tenants,
    /// The session-ticket keys: a reload must not void the tickets issued.
    pub tickets: &'a Arc<Ticketer>,
    /// The per-client limits' counts: a reload keeps what clients have used.
    pub clients: &'a Arc<Clients>,
    /// `terminus check`: log files are looked at, not opened (a check run as root must
    /// not create a root-owned log the service then cannot write).
    pub checking: bool,
}

impl Site {
    /// Loads every certificate and docroot of `config`. `self_signed` serves hosts that
    /// name no certificate.
    /// Upstream servers count in `proxy_metrics`; `tenants` keeps the tenants' accounts,
    /// updated to the configuration's quotas only once everything else has loaded.
    pub fn build(config: &Config, kept: &Kept<'_>) -> Result<Self, ConfigError> {
        let Kept {
            self_signed,
            proxy_metrics,
            tenants,
            tickets,
            clients,
            checking,
        } = *kept;
        let err = |line: Option<usize>, message: String, hint: Option<&str>| {
            config.error_at(line, message, hint)
        };
        let mut resolver_hosts = Vec::new();
        let mut hosts = Vec::new();
        let mut certificates = Vec::new();
        let mut signing_keys = Vec::new();
        let upstreams: Vec<Arc<Upstream>> = config
            .upstreams
            .iter()
            .map(|spec| Arc::new(Upstream::new(spec.clone(), proxy_metrics)))
            .collect();
        for server in &config.servers {
            let find = |name: &str| {
                upstreams
                    .iter()
                    .find(|u| u.name() == name)
                    .expect("routes and streams name defined upstreams (checked when resolved)")
                    .clone()
            };
            let stream = server.stream.as_ref().map(|s| (find(&s.upstream), s.mode));
            let mut certs = VirtualHostCerts::default();
            let passthrough = matches!(stream, Some((_, StreamMode::Passthrough)));
            let loaded = if passthrough {
                // Its server answers the handshake.
                Vec::new()
            } else {
                server_certificates(config, server, self_signed)?
            };
            if loaded.is_empty() && !passthrough {
                return Err(err(
                    server.line,
                    format!("server {:?} has no certificate", server.names),
                    Some("add [[server.certificate]] cert = ... key = ..."),
                ));
            }
            for cert in loaded {
                signing_keys.extend(cert.key.clone());
                certificates.push((
                    server.names.join(","),
                    cert.algorithm.label(),
                    cert.fingerprint(),
                ));
                if certs.insert(cert).is_some() {
                    return Err(err(
                        server.line,
                        format!(
                            "server {:?} has two certificates of the same key type",
                            server.names
                        ),
                        Some("give one RSA and/or one ECDSA certificate"),
                    ));
                }
            }
            // A stream's name asked for over HTTP is another server's (421, app.rs).
            let routes = if stream.is_some() {
                Routes::new(Vec::new())
            } else {
                server_routes(config, server, find)?
            };
            let pages = server
                .error_pages
                .iter()
                .map(|p| (p.status, p.path.as_path()));
            let error_pages = ErrorPages::load(pages).map_err(|(status, e)| {
                let line = server.error_pages.first().and_then(|p| p.line);
                err(
                    line.or(server.line),
                    format!("error page for {status}: {e}"),
                    Some("each of error_pages is a readable file of at most 1 MiB"),
                )
            })?;
            resolver_hosts.push((server.names.clone(), certs));
            hosts.push((routes, stream, error_pages));
        }
        let resolver = Arc::new(SniResolver::new(
            resolver_hosts,
            config.default_server_index(),
        ));
        let (tls, verifying) = tls_configs(config, &resolver, tickets, &err)?;
        let opened = if checking {
            logs::check_access(&config.access_log).map(|()| None)
        } else {
            logs::access(&config.access_log, config.log_format)
        };
        let access_log = opened.map_err(|e| {
            err(
                None,
                format!("access log: {e}"),
                Some("log.access is \"off\", \"stdout\" or a writable file path"),
            )
        })?;
        let mut stream_tls = (*tls).clone();
        stream_tls.alpn_protocols.clear();
        // A server's client-certificate policy: its configuration and revocations.
        let policy_of = |server: &terminus_config::ServerConfig| {
            server.client_auth.as_ref().map(|policy| {
                verifying
                    .iter()
                    .find(|(p, ..)| p == policy)
                    .expect("a configuration for every policy")
            })
        };
        let hosts = hosts
            .into_iter()
            .zip(&config.servers)
            .map(|((routes, stream, error_pages), server)| Host {
                names: server.names.clone(),
                tls: policy_of(server).map_or_else(|| tls.clone(), |(_, config, _)| config.clone()),
                client_auth: server.client_auth.as_ref().map(|p| p.mode),
                revocations: policy_of(server).map(|(.., revocations)| revocations.clone()),
                routes,
                stream,
                headers: server.headers.clone(),
                token: terminus_http::ServerToken::new(server.server_header.clone()),
                access: server.access.clone(),
                rate: server.rate.as_ref().map(|r| RateRule::new(server, None, r)),
                precompressed: server.precompressed.clone(),
                error_pages,
                tenant: tenant_of(config, server, tenants),
            })
            .collect::<Vec<Host>>();
        tenants.retain(hosts.iter().map(|h| h.tenant.name()));
        Ok(Self {
            tls,
            stream_tls: Arc::new(stream_tls),
            tls_versions: config.tls.versions.iter().map(|v| v.version).collect(),
            resumption: config.tls.session_tickets || config.tls.session_cache > 0,
            quotas: hosts.iter().any(|h| h.tenant.quota().is_some()),
            resolver,
            hosts,
            timeouts: Timeouts {
                handshake: config.handshake_timeout,
                http: terminus_http::Timeouts {
                    request_header: config.request_header_timeout,
                    keepalive: config.keepalive_timeout,
                },
            },
            access_log,
            files: Caching {
                on: config.files.cache,
                entries: config.files.cache_entries,
                valid: config.files.cache_valid.0,
                inactive: config.files.cache_inactive.0,
                max_size: config.files.cache_max_size,
            },
            certificates,
            signing_keys,
            upstreams,
            clients: clients.clone(),
            connections_per_client: config.connections_per_client,
        })
    }
}

/// The current [`Site`], swapped on reload.
#[derive(Clone)]
pub struct SiteHandle(Arc<RwLock<Arc<Site>>>);

impl SiteHandle {
    pub fn new(site: Site) -> Self {
        Self(Arc::new(RwLock::new(Arc::new(site))))
    }

    pub fn current(&self) -> Arc<Site> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn replace(&self, site: Site) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(site);
    }
}

/// QUIC's certificates: whichever site is current's, for a TLS configuration built once
/// and kept across reloads (quinn-proto holds its configuration for the endpoint's life),
/// so that a reload's or an ACME renewal's certificates reach it. Called once rustls has
/// the whole ClientHello, before any crypto: it first asks the worker's admission
/// ([`crate::admission::quic`]), and a handshake refused there gets no certificate.
#[derive(Debug)]
pub struct LiveCertificates(pub SiteHandle);

impl std::fmt::Debug for SiteHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SiteHandle")
    }
}

impl rustls::server::ResolvesServerCert for LiveCertificates {
    fn resolve(
        &self,
        hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        let site = self.0.current();
        let host = site.resolver.lookup(hello.server_name());
        let question = crate::admission::quic::QuicHello {
            tenant: site.hosts[host].tenant.clone(),
            sign: site.resolver.key_for(&hello),
            kx: crate::admission::quota::first_kx(&hello),
        };
        // Every QUIC handshake step runs on the bridge, whose driver answers: no answer
        // (nothing QUIC does) is no admission.
        let admitted = terminus_tls::handshake::bridge::ask(Box::new(question))
            .and_then(|told| told.downcast::<bool>().ok())
            .is_some_and(|admitted| *admitted);
        if !admitted {
            return None;
        }
        site.resolver.resolve(hello)
    }
}

/// A `certificates = "acme"` server's certificates: those the state directory holds that
/// are valid now and for exactly its names; without any, the self-signed ones (before
/// the first order completes, or while it is retried).
fn acme_certificates(
    names: &[String],
    acme: Option<&terminus_acme::AcmeSettings>,
    self_signed: &[LoadedCert],
) -> Vec<LoadedCert> {
    let Some(acme) = acme else {
        return self_signed.to_vec();
    };
    let state = terminus_acme::StateDir::new(&acme.state_dir);
    let now = std::time::SystemTime::now();
    let mut loaded: Vec<LoadedCert> = Vec::new();
    for kind in terminus_acme::CertKind::ALL {
        match state.load(names, kind) {
            Ok(Some(stored)) if stored.serves(names, now) => {
                match LoadedCert::from_files(&stored.path, &stored.path) {
                    Ok(cert) => loaded.push(cert),
                    Err(e) => tracing::warn!("acme: {}: {e}; not served", stored.path.display()),
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(
                "acme: the {} certificate for {}: {e}",
                kind.name(),
                names[0]
            ),
        }
    }
    // One valid certificate from the CA serves alone: a self-signed one beside it would
    // be chosen by every client that takes its key type (ECDSA is preferred), and fail.
    if loaded.is_empty() {
        tracing::info!(
            "acme: {} has no certificate from the CA yet; the self-signed ones are served until one is issued",
            names[0]
        );
        return self_signed.to_vec();
    }
    loaded
}

/// The tag of tickets issued where no client certificate is asked for, once some server
/// asks for one.
const NO_CLIENT_AUTH: [u8; 8] = *b"no-mtls\0";

/// A terminated server's certificates: ACME's, its files', or the embedded default's
/// self-signed ones for a server that names none.
fn server_certificates(
    config: &Config,
    server: &terminus_config::ServerConfig,
    self_signed: &[LoadedCert],
) -> Result<Vec<LoadedCert>, ConfigError> {
    if server.acme {
        return Ok(acme_certificates(
            &server.names,
            config.acme.as_ref(),
            self_signed,
        ));
    }
    if server.certificates.is_empty() {
        return Ok(self_signed.to_vec());
    }
    server
        .certificates
        .iter()
        .map(|c| {
            let loaded = match &c.key {
                KeySource::File(key) => LoadedCert::from_files(&c.cert, key),
                KeySource::Signers(remote) => {
                    let signers = signer_set(remote).map_err(|e| {
                        config.error_at(c.line.or(server.line), e, Some("the signers' ca, and this terminator's cert and key, must be readable PEM files"))
                    })?;
                    LoadedCert::with_remote_key(&c.cert, |spki| {
                        let key = terminus_keyless::client::RemoteSigningKey::new(spki, signers)?;
                        Ok(Arc::new(key) as Arc<dyn terminus_engine::RemoteKey>)
                    })
                }
            };
            loaded.map_err(|e| {
                config.error_at(
                    c.line.or(server.line),
                    e.to_string(),
                    Some("each [[server.certificate]] needs a PEM chain (leaf first) and its unencrypted key (or key = { signer = ... })"),
                )
            })
        })
        .collect()
}

/// The signers of a remote key: certificates (and reloads) naming the same signers the
/// same way, with the same files, share one set, so that they share its connections
/// and its marks of who is down; a reload after the files changed makes a new one.
fn signer_set(
    remote: &RemoteKeyConfig,
) -> Result<Arc<terminus_keyless::client::SignerSet>, String> {
    type Sets = Vec<(
        RemoteKeyConfig,
        Vec<u8>,
        std::sync::Weak<terminus_keyless::client::SignerSet>,
    )>;
    static SETS: std::sync::Mutex<Sets> = std::sync::Mutex::new(Vec::new());
    let mut files = Vec::new();
    for path in [&remote.ca, &remote.cert, &remote.key] {
        files.extend(std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?);
    }
    let files = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &files)
        .as_ref()
        .to_vec();
    let mut sets = SETS.lock().unwrap_or_else(|e| e.into_inner());
    // Sets no site holds any more are gone (the workers' sweeps close their
    // connections).
    sets.retain(|(_, _, set)| set.strong_count() > 0);
    if let Some(set) = sets
        .iter()
        .find(|(c, f, _)| c == remote && *f == files)
        .and_then(|(_, _, set)| set.upgrade())
    {
        return Ok(set);
    }
    let tls = terminus_keyless::client::client_config(&remote.ca, &remote.cert, &remote.key)?;
    let metrics = terminus_keyless::metrics::ClientMetrics::for_signers(&remote.signers);
    let set = Arc::new(terminus_keyless::client::SignerSet::new(
        remote.signers.clone(),
        tls,
        remote.timeout,
        metrics,
    )?);
    sets.push((remote.clone(), files, Arc::downgrade(&set)));
    Ok(set)
}

/// An HTTP server's routes, docroots opened; the built-in page where it has none.
fn server_routes(
    config: &Config,
    server: &terminus_config::ServerConfig,
    find: impl Fn(&str) -> Arc<Upstream>,
) -> Result<Routes, ConfigError> {
    if server.routes.is_empty() {
        return Ok(Routes::everything(Route::BuiltinPage));
    }
    let mut routes = Vec::new();
    for r in &server.routes {
        let route = match &r.target {
            RouteTarget::Root(root) => Route::Files(DocRoot::open(root).map_err(|e| {
                config.error_at(
                    r.line.or(server.line),
                    format!("root {}: {e}", root.display()),
                    Some("root must be an existing, readable directory"),
                )
            })?),
            RouteTarget::Upstream(name) => Route::Proxy {
                upstream: find(name),
                rewrite: r.rewrite.as_ref().map(|to| Rewrite {
                    from: r.path.clone(),
                    to: to.clone(),
                }),
                intercept_errors: r.intercept_errors,
            },
            RouteTarget::Redirect { to, status } => Route::Redirect {
                to: to.clone(),
                status: hyper::StatusCode::from_u16(*status).expect("a redirect status (checked)"),
            },
        };
        routes.push(Entry {
            prefix: r.path.clone(),
            route,
            access: r.access.clone(),
            rate: r.rate.as_ref().map(|own| {
                own.as_ref()
                    .map(|limit| RateRule::new(server, Some(&r.path), limit))
            }),
            compression: r.compression.clone(),
        });
    }
    Ok(Routes::new(routes))
}

/// The account a server's handshakes are charged to: its tenant's, else the default's.
fn tenant_of(
    config: &Config,
    server: &terminus_config::ServerConfig,
    tenants: &Tenants,
) -> Arc<TenantAccount> {
    match &server.tenant {
        None => tenants.account(DEFAULT_TENANT, None),
        Some(name) => {
            let quota = config
                .tenants
                .iter()
                .find(|t| &t.name == name)
                .map(|t| t.quota.clone());
            debug_assert!(quota.is_some(), "tenant names checked when resolved");
            tenants.account(name, quota)
        }
    }
}

/// The site's rustls configuration, and one per distinct client-certificate policy of
/// its servers (with what the policy's CRLs revoke). With any policy, every
/// configuration's tickets carry the policy they were issued under, so that none resumes
/// under another: its tag is of the policy's files as read now, so a reload that brings
/// a new CRL (or CA) at the same path voids the tickets issued under the old one.
#[allow(clippy::type_complexity)]
fn tls_configs(
    config: &Config,
    resolver: &Arc<SniResolver>,
    tickets: &Arc<terminus_fleet::tickets::Ticketer>,
    err: &dyn Fn(Option<usize>, String, Option<&str>) -> ConfigError,
) -> Result<
    (
        Arc<rustls::ServerConfig>,
        Vec<(
            terminus_tls::ClientAuthPolicy,
            Arc<rustls::ServerConfig>,
            Arc<terminus_tls::Revocations>,
        )>,
    ),
    ConfigError,
> {
    let mut policies: Vec<(&terminus_tls::ClientAuthPolicy, Option<usize>)> = Vec::new();
    for server in &config.servers {
        if let Some(p) = &server.client_auth {
            if policies.iter().all(|(q, _)| *q != p) {
                policies.push((p, server.line));
            }
        }
    }
    let ticketer = |tag: [u8; 8]| -> Arc<dyn rustls::server::ProducesTickets> {
        if policies.is_empty() {
            tickets.clone()
        } else {
            Arc::new(terminus_tls::PolicyTickets::new(tickets.clone(), tag))
        }
    };
    let tls = config
        .tls
        .server_config(resolver.clone(), ticketer(NO_CLIENT_AUTH))
        .map_err(|e| err(None, format!("[tls]: {e}"), None))?;
    let mut verifying = Vec::new();
    for (policy, line) in &policies {
        // One reading of the files for the verifier, the tag and the revocations.
        let loaded = policy.load().map_err(|e| {
            err(
                *line,
                format!("client_auth: {e}"),
                Some("ca holds the PEM certificates of the CAs that sign clients; crl PEM or DER revocation lists"),
            )
        })?;
        let verifying_config = config
            .tls
            .server_config_verifying(
                resolver.clone(),
                ticketer(loaded.tag),
                Some(loaded.verifier),
            )
            .map_err(|e| err(*line, format!("[tls]: {e}"), None))?;
        verifying.push(((*policy).clone(), verifying_config, loaded.revocations));
    }
    Ok((tls, verifying))
}
