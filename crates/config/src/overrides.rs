//! Command-line flags, applied over the file: each names itself in its error.

use std::path::PathBuf;

use crate::listen::KTLS_HINT;
use crate::{
    BackendChoice, CertPaths, Config, ConfigError, Ctx, KtlsMode, Listen, RouteConfig, RouteTarget,
};

/// Command-line flags that override the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--listen ADDR`: replaces every listener.
    pub listen: Vec<String>,
    /// `--cert CERT --key KEY`: the default server's certificates.
    pub certs: Vec<(PathBuf, PathBuf)>,
    /// `--root DIR`: the default server's docroot.
    pub root: Option<PathBuf>,
    /// `--workers N`.
    pub workers: Option<usize>,
    /// `--pin`: one worker per CPU, pinned.
    pub pin: bool,
    /// `--crypto-backend NAME`.
    pub crypto_backend: Option<String>,
    /// `--no-resumption`: no tickets and no session cache.
    pub no_resumption: bool,
    /// `--admin ADDR`: where `/metrics` is served.
    pub admin: Option<String>,
    /// `--ktls MODE`: every listener's `ktls`.
    pub ktls: Option<String>,
}

impl Config {
    pub(super) fn apply(&mut self, o: &Overrides, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        let flag_err = |flag: &str, msg: String, hint: &str| ConfigError {
            file: format!("{} (command line {flag})", ctx.file),
            line: None,
            message: msg,
            hint: Some(hint.to_owned()),
        };
        if !o.listen.is_empty() {
            let ktls = self.listen.first().map_or(KtlsMode::Auto, |l| l.ktls);
            self.listen = o
                .listen
                .iter()
                .map(|l| {
                    let addr = l.parse().map_err(|_| {
                        flag_err(
                            "--listen",
                            format!("{l:?} is not IP:PORT"),
                            "e.g. --listen 0.0.0.0:443",
                        )
                    })?;
                    Ok(Listen {
                        addr,
                        ktls,
                        proxy_protocol: None,
                        forwarded_from: None,
                        plain: None,
                        http3: false,
                    })
                })
                .collect::<Result<_, _>>()?;
        }
        if let Some(k) = &o.ktls {
            let mode = KtlsMode::from_name(k)
                .ok_or_else(|| flag_err("--ktls", format!("unknown mode {k:?}"), KTLS_HINT))?;
            for l in &mut self.listen {
                l.ktls = mode;
            }
        }
        if let Some(w) = o.workers {
            if w == 0 || w > 1024 {
                return Err(flag_err(
                    "--workers",
                    format!("{w} workers"),
                    "use 1 to 1024",
                ));
            }
            self.workers = Some(w);
        }
        self.pin |= o.pin;
        if let Some(b) = &o.crypto_backend {
            self.crypto.backend = BackendChoice::from_name(b).ok_or_else(|| {
                flag_err(
                    "--crypto-backend",
                    format!("unknown backend {b:?}"),
                    "use auto, multibuffer, scalar or threads",
                )
            })?;
        }
        if o.no_resumption {
            self.tls.session_tickets = false;
            self.tls.session_cache = 0;
            // 0-RTT rides on resumption.
            self.http3_early_data = false;
        }
        if let Some(a) = &o.admin {
            self.admin = Some(a.parse().map_err(|_| {
                flag_err(
                    "--admin",
                    format!("{a:?} is not IP:PORT"),
                    "e.g. --admin 127.0.0.1:9100",
                )
            })?);
        }
        let default = self.default_server_index();
        if !o.certs.is_empty() {
            self.servers[default].certificates = o
                .certs
                .iter()
                .map(|(cert, key)| CertPaths {
                    cert: cert.clone(),
                    key: crate::KeySource::File(key.clone()),
                    line: None,
                })
                .collect();
        }
        if let Some(root) = &o.root {
            // --root serves "/" of the default server, whatever the file said for it.
            // (Compressed as the file's "/" was, if it was.)
            let routes = &mut self.servers[default].routes;
            let compression = routes
                .iter()
                .find(|r| r.path == "/")
                .and_then(|r| r.compression.clone());
            routes.retain(|r| r.path != "/");
            routes.push(RouteConfig {
                path: "/".into(),
                target: RouteTarget::Root(root.clone()),
                line: None,
                access: None,
                rate: None,
                compression,
                rewrite: None,
                intercept_errors: false,
            });
        }
        Ok(())
    }
}
