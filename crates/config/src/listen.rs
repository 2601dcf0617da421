//! `listen`: the addresses served, each with how its connections are carried after the
//! handshake (kTLS), who may say who the client is (PROXY protocol, forwarded headers),
//! and whether it is plain HTTP or also QUIC.
//!
//! ```toml
//! listen = ["0.0.0.0:443", { address = "0.0.0.0:80", plain = "redirect" },
//!           { address = "[::]:443", ktls = "off", http3 = true }]
//! ```

use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::sync::Arc;

use toml::Spanned;

use crate::cidr::{self, Cidr};
use crate::schema::{ConfigFile, ListenEntry, ListenOptions};
use crate::{ConfigError, Ctx, DEFAULT_LISTEN};

/// Whether a listener hands connections to kernel TLS after the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KtlsMode {
    /// Kernel TLS where the kernel takes the connection, userspace TLS otherwise.
    Auto,
    /// Always userspace TLS.
    Off,
    /// Kernel TLS or no connection.
    Required,
}

impl KtlsMode {
    /// The mode a `ktls` setting names.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "auto" => Some(Self::Auto),
            "off" => Some(Self::Off),
            "required" => Some(Self::Required),
            _ => None,
        }
    }

    /// As the setting writes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Off => "off",
            Self::Required => "required",
        }
    }
}

pub(crate) const KTLS_HINT: &str =
    "use \"auto\" (kernel TLS where the kernel has it), \"off\" or \"required\"";

/// One listening address and how its connections are carried after the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listen {
    /// The address bound.
    pub addr: SocketAddr,
    /// Its kTLS mode (its own `ktls`, else `tls.ktls`).
    pub ktls: KtlsMode,
    /// `proxy_protocol = true`: connections from these networks begin with a PROXY
    /// protocol header, which says who the client is.
    pub proxy_protocol: Option<Arc<[Cidr]>>,
    /// `forwarded_from`: only clients in these networks have their own X-Forwarded-For
    /// and Forwarded passed on (appended to); others' are replaced. `None`: everyone's
    /// are kept, as nginx's `$proxy_add_x_forwarded_for`.
    pub forwarded_from: Option<Arc<[Cidr]>>,
    /// `plain = "redirect"`: HTTP/1.1 without TLS. `None`: TLS.
    pub plain: Option<Plain>,
    /// `http3 = true`: QUIC (UDP) on the same address too.
    pub http3: bool,
}

/// What a plain-HTTP listener does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plain {
    /// Answers ACME HTTP-01 challenges, and sends every other request to the same host
    /// and path over HTTPS (308).
    Redirect,
}

impl Listen {
    /// Whether `client`'s own forwarding fields are passed on upstream.
    pub fn keeps_forwarded(&self, client: IpAddr) -> bool {
        self.forwarded_from
            .as_ref()
            .is_none_or(|nets| nets.iter().any(|n| n.contains(client)))
    }

    fn default_address(ktls: KtlsMode) -> Self {
        Listen {
            addr: DEFAULT_LISTEN.parse().expect("valid default"),
            ktls,
            proxy_protocol: None,
            forwarded_from: None,
            plain: None,
            http3: false,
        }
    }
}

/// `listen` (and `tls.ktls`, its default kTLS mode): `127.0.0.1:8443` when it is left
/// out.
pub(crate) fn resolve(raw: &ConfigFile, ctx: &Ctx<'_>) -> Result<Vec<Listen>, ConfigError> {
    let default_ktls = match &raw.tls.ktls {
        Some(k) => ktls_mode(k.get_ref(), k.span(), ctx)?,
        None => KtlsMode::Auto,
    };
    let mut listen = raw
        .listen
        .iter()
        .map(|entry| resolve_entry(entry, default_ktls, ctx))
        .collect::<Result<Vec<_>, _>>()?;
    if listen.is_empty() {
        listen.push(Listen::default_address(default_ktls));
    }
    Ok(listen)
}

fn ktls_mode(name: &str, span: Range<usize>, ctx: &Ctx<'_>) -> Result<KtlsMode, ConfigError> {
    KtlsMode::from_name(name).ok_or_else(|| {
        ctx.err(
            Some(span),
            format!("ktls = {name:?} is not a kTLS mode"),
            Some(KTLS_HINT.to_owned()),
        )
    })
}

/// One `listen` entry: an address, or a table of one with its options.
fn resolve_entry(
    entry: &Spanned<ListenEntry>,
    default_ktls: KtlsMode,
    ctx: &Ctx<'_>,
) -> Result<Listen, ConfigError> {
    let (address, ktls, options) = match entry.get_ref() {
        ListenEntry::Address(a) => (a, None, None),
        ListenEntry::Options(o) => (&o.address, o.ktls.as_deref(), Some(o)),
    };
    let err = |message: String, hint: Option<&str>| {
        ctx.err(Some(entry.span()), message, hint.map(str::to_owned))
    };
    let forwarded_from = options
        .and_then(|o| o.forwarded_from.as_deref())
        .map(|list| cidr::networks(list, "forwarded_from", ctx))
        .transpose()?;
    let proxy_protocol = match options {
        Some(ListenOptions {
            proxy_protocol: true,
            trusted,
            ..
        }) => {
            let trusted = trusted.as_deref().unwrap_or_default();
            if trusted.is_empty() {
                return Err(err(
                    format!("listener {address}: proxy_protocol needs the balancers' networks in trusted"),
                    Some("trusted = [\"10.0.0.0/8\"]: only connections from there may send a PROXY header"),
                ));
            }
            Some(cidr::networks(trusted, "trusted", ctx)?)
        }
        Some(o) if o.trusted.is_some() => {
            return Err(err("trusted is for proxy_protocol = true".to_owned(), None))
        }
        _ => None,
    };
    let plain = match options.and_then(|o| o.plain.as_deref()) {
        None => None,
        Some("redirect") => Some(Plain::Redirect),
        Some(other) => return Err(err(
            format!("listener {address}: plain = {other:?} is not a plain-HTTP mode"),
            Some(
                "plain = \"redirect\" (ACME challenges answered, everything else sent to https://)",
            ),
        )),
    };
    let http3 = options.is_some_and(|o| o.http3);
    if plain.is_some() && http3 {
        return Err(err(
            format!("listener {address}: http3 is for TLS listeners, and this one is plain"),
            Some("put http3 = true on the TLS listener (port 443)"),
        ));
    }
    if plain.is_some() && ktls.is_some() {
        return Err(err(
            format!("listener {address}: ktls is for TLS listeners, and this one is plain"),
            None,
        ));
    }
    Ok(Listen {
        addr: ctx.addr(&Spanned::new(entry.span(), address.clone()), "listen")?,
        ktls: match ktls {
            Some(k) => ktls_mode(k, entry.span(), ctx)?,
            None => default_ktls,
        },
        proxy_protocol,
        forwarded_from,
        plain,
        http3,
    })
}
