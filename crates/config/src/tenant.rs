//! `[[tenant]]`: a share of the machine's crypto capacity that one or more `[[server]]`s
//! use (`tenant = "name"`), or a `[[server]]`'s own (`capacity = { ... }` on the server).
//!
//! ```toml
//! [[tenant]]
//! name = "shop"
//! capacity = { acu = 2000, acu_peak = 3000, scu = 500 }
//! over_quota = "queue"    # or "refuse", "prefer_cheap"
//! max_wait = "100ms"      # how long "queue" waits at most
//! ```
//!
//! What the numbers mean is in `terminus_admission::tenant`.

use std::time::Duration;

use serde::Deserialize;
use terminus_admission::tenant::{OverQuota, Quota};
use toml::Spanned;

use super::schema::{parse_duration, ServerSection};
use super::{ConfigError, Ctx};

/// How long a queued handshake waits for its quota unless `max_wait` says otherwise.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_millis(100);

/// A `[[tenant]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSection {
    pub name: Spanned<String>,
    pub capacity: Spanned<CapacitySection>,
    pub over_quota: Option<Spanned<String>>,
    pub max_wait: Option<Spanned<String>>,
}

/// `capacity = { acu = 2000, acu_peak = 3000, scu = 500 }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapacitySection {
    pub acu: Spanned<f64>,
    pub acu_peak: Option<Spanned<f64>>,
    pub scu: Option<Spanned<f64>>,
}

/// A tenant with its quota, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantConfig {
    /// Its `name` (a server's own `capacity` makes one named after the server).
    pub name: String,
    /// Its share of the machine's handshake capacity.
    pub quota: Quota,
    /// The line it is declared on.
    pub line: Option<usize>,
}

/// Every `[[tenant]]`, and the tenants `[[server]]`s make with their own `capacity`.
/// Returns them with each server's tenant name (None: the default tenant), in server
/// order.
/// `handshake`: the handshake timeout, which a quota's wait must stay below.
pub(super) fn resolve(
    tenants: &[TenantSection],
    servers: &[ServerSection],
    handshake: Duration,
    ctx: &Ctx<'_>,
) -> Result<(Vec<TenantConfig>, Vec<Option<String>>), ConfigError> {
    let mut resolved: Vec<TenantConfig> = Vec::new();
    for t in tenants {
        let name = t.name.get_ref();
        ctx.name(name, t.name.span(), "tenant name")?;
        if name.is_empty() || name == DEFAULT_TENANT {
            return Err(ctx.err(
                Some(t.name.span()),
                format!("{name:?} cannot name a tenant"),
                Some(format!(
                    "{DEFAULT_TENANT:?} is the tenant of servers without one; choose another name"
                )),
            ));
        }
        if resolved.iter().any(|r| &r.name == name) {
            return Err(ctx.err(
                Some(t.name.span()),
                format!("a [[tenant]] named {name:?} is already defined"),
                Some("give each tenant its own name".to_owned()),
            ));
        }
        let quota = quota(
            &t.capacity,
            t.over_quota.as_ref(),
            t.max_wait.as_ref(),
            handshake,
            ctx,
        )?;
        resolved.push(TenantConfig {
            name: name.clone(),
            quota,
            line: ctx.line_of(t.name.span()),
        });
    }
    let mut of_server = Vec::with_capacity(servers.len());
    for s in servers {
        match (&s.tenant, &s.capacity) {
            (Some(tenant), Some(capacity)) => {
                return Err(ctx.err(
                    Some(capacity.span()),
                    format!(
                        "this [[server]] has both tenant = {:?} and a capacity of its own",
                        tenant.get_ref()
                    ),
                    Some(
                        "keep one: the [[tenant]]'s capacity is shared by the servers naming it"
                            .to_owned(),
                    ),
                ))
            }
            (Some(tenant), None) => {
                if !resolved.iter().any(|r| &r.name == tenant.get_ref()) {
                    return Err(ctx.err(
                        Some(tenant.span()),
                        format!("no [[tenant]] is named {:?}", tenant.get_ref()),
                        Some(
                            "define it: [[tenant]] name = ... capacity = { acu = ... }".to_owned(),
                        ),
                    ));
                }
                of_server.push(Some(tenant.get_ref().clone()));
            }
            (None, Some(capacity)) => {
                // The server's own tenant, named after its first name.
                let name = s.names.get_ref().first().cloned().unwrap_or_default();
                if resolved.iter().any(|r| r.name == name) {
                    return Err(ctx.err(
                        Some(capacity.span()),
                        format!("a tenant named {name:?} already exists"),
                        Some("name the [[tenant]] otherwise, or use tenant = ... here".to_owned()),
                    ));
                }
                let quota = quota(capacity, None, None, handshake, ctx)?;
                resolved.push(TenantConfig {
                    name: name.clone(),
                    quota,
                    line: ctx.line_of(capacity.span()),
                });
                of_server.push(Some(name));
            }
            (None, None) => of_server.push(None),
        }
    }
    Ok((resolved, of_server))
}

/// The tenant of servers without one: accounted, not limited.
pub const DEFAULT_TENANT: &str = "default";

fn quota(
    capacity: &Spanned<CapacitySection>,
    over_quota: Option<&Spanned<String>>,
    max_wait: Option<&Spanned<String>>,
    handshake: Duration,
    ctx: &Ctx<'_>,
) -> Result<Quota, ConfigError> {
    let c = capacity.get_ref();
    let positive = |value: &Spanned<f64>, what: &str| -> Result<f64, ConfigError> {
        let v = *value.get_ref();
        if v.is_finite() && v > 0.0 {
            Ok(v)
        } else {
            Err(ctx.err(
                Some(value.span()),
                format!("capacity {what} = {v} must be a positive number"),
                Some(format!(
                    "{what} is in {}",
                    if what == "scu" {
                        "Mbps of bulk encryption"
                    } else {
                        "RSA-2048 operations per second; `terminus capacity` measures the machine's"
                    }
                )),
            ))
        }
    };
    let acu = positive(&c.acu, "acu")?;
    let acu_peak = match &c.acu_peak {
        Some(peak) => {
            let p = positive(peak, "acu_peak")?;
            if p < acu {
                return Err(ctx.err(
                    Some(peak.span()),
                    format!("capacity acu_peak = {p} is below acu = {acu}"),
                    Some("the peak is the most a tenant may use, borrowing included: at least its committed acu".to_owned()),
                ));
            }
            p
        }
        None => acu,
    };
    let scu = c.scu.as_ref().map(|s| positive(s, "scu")).transpose()?;
    let over_quota = match over_quota {
        None => OverQuota::Queue,
        Some(action) => OverQuota::from_name(action.get_ref()).ok_or_else(|| {
            ctx.err(
                Some(action.span()),
                format!("over_quota = {:?} is not an action", action.get_ref()),
                Some(format!(
                    "use one of {}",
                    OverQuota::NAMES.map(|n| format!("{n:?}")).join(", ")
                )),
            )
        })?,
    };
    let max_wait = match max_wait {
        None => DEFAULT_MAX_WAIT,
        Some(text) => {
            let wait = parse_duration(text.get_ref()).ok_or_else(|| {
                ctx.err(
                    Some(text.span()),
                    format!("max_wait = {:?} is not a duration", text.get_ref()),
                    Some("write it like \"100ms\" or \"1s\"".to_owned()),
                )
            })?;
            // A wait the handshake cannot outlast holds a connection for nothing.
            if wait >= handshake {
                return Err(ctx.err(
                    Some(text.span()),
                    format!(
                        "max_wait = {:?} is not below the handshake timeout ({handshake:?})",
                        text.get_ref()
                    ),
                    Some("a handshake waiting on its quota times out at timeouts.handshake: make max_wait shorter".to_owned()),
                ));
            }
            wait
        }
    };
    Ok(Quota {
        acu,
        acu_peak,
        scu,
        over_quota,
        max_wait,
    })
}
