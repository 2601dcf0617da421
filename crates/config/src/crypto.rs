//! `[crypto]`: which engine backend computes handshake crypto, where crypto_mb batches run,
//! and how long a batch may wait to fill.
//!
//! The counts that depend on the machine (crypto threads, cores given to crypto_mb) stay
//! `None` when left out: the server's placement decides them from the CPUs it may use.

use std::time::Duration;

use terminus_capacity::simd::Placement;
use terminus_engine::BackendKind;

use crate::schema::ConfigFile;
use crate::{ConfigError, Ctx};

/// `[crypto]`, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crypto {
    /// `backend`.
    pub backend: BackendChoice,
    /// `threads`: the `threads` backend's pool; `None`: one per CPU.
    pub threads: Option<usize>,
    /// `queue_capacity`: operations waiting for the crypto threads.
    pub queue_capacity: usize,
    /// `simd`: where crypto_mb batches run.
    pub simd: Placement,
    /// `simd_cores`: physical cores given to crypto threads when dedicated; `None`: one
    /// per eight CPUs.
    pub simd_cores: Option<usize>,
    /// `max_batch_delay`: the longest an operation waits for its batch to fill.
    pub max_batch_delay: Duration,
}

/// What `crypto.backend` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// multibuffer where crypto_mb runs on this CPU, else scalar: decided at start.
    Auto,
    /// This backend, or no start.
    Use(BackendKind),
}

impl BackendChoice {
    /// The choice a `backend` setting (or `--crypto-backend`) names.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "auto" => Some(Self::Auto),
            other => BackendKind::from_name(other).map(Self::Use),
        }
    }
}

const BACKEND_HINT: &str = "use \"auto\", \"multibuffer\", \"scalar\" or \"threads\"";
const SIMD_HINT: &str = "use \"auto\" (measured at start-up), \"inline\" (batches on the workers) or \"dedicated\" (on cores of their own)";

/// `[crypto]` but its `max_batch_delay` (resolved later, in the file's order of checks:
/// [`max_batch_delay`]). A dedicated placement with a backend that computes no batches is
/// refused.
pub(crate) fn resolve(raw: &ConfigFile, ctx: &Ctx<'_>) -> Result<Crypto, ConfigError> {
    let c = &raw.crypto;
    let backend = match &c.backend {
        None => BackendChoice::Auto,
        Some(b) => BackendChoice::from_name(b.get_ref()).ok_or_else(|| {
            ctx.err(
                Some(b.span()),
                format!("unknown crypto backend {:?}", b.get_ref()),
                Some(BACKEND_HINT.to_owned()),
            )
        })?,
    };
    let simd = match &c.simd {
        None => Placement::Auto,
        Some(p) => Placement::from_name(p.get_ref()).ok_or_else(|| {
            ctx.err(
                Some(p.span()),
                format!("unknown crypto.simd placement {:?}", p.get_ref()),
                Some(SIMD_HINT.to_owned()),
            )
        })?,
    };
    if let (Some(p), BackendChoice::Use(kind @ (BackendKind::Scalar | BackendKind::Threads))) =
        (c.simd.as_ref(), backend)
    {
        if simd == Placement::Dedicated {
            return Err(ctx.err(
                Some(p.span()),
                format!(
                    "crypto.simd = \"dedicated\" places crypto_mb batches, and backend = {:?} computes none",
                    kind.name()
                ),
                Some("use backend = \"multibuffer\" or \"auto\", or leave simd out".to_owned()),
            ));
        }
    }
    let simd_cores = match &c.simd_cores {
        Some(n) if *n.get_ref() == 0 || *n.get_ref() > 1024 => {
            return Err(ctx.err(
                Some(n.span()),
                "crypto.simd_cores must be between 1 and 1024",
                None,
            ))
        }
        other => other.as_ref().map(|n| *n.get_ref()),
    };
    Ok(Crypto {
        backend,
        threads: c.threads.map(|n| n.max(1)),
        queue_capacity: c.queue_capacity.unwrap_or(1024).max(1),
        simd,
        simd_cores,
        max_batch_delay: DEFAULT_MAX_BATCH_DELAY,
    })
}

const DEFAULT_MAX_BATCH_DELAY: Duration = Duration::from_millis(2);

/// `crypto.max_batch_delay`.
pub(crate) fn max_batch_delay(raw: &ConfigFile, ctx: &Ctx<'_>) -> Result<Duration, ConfigError> {
    ctx.duration(
        &raw.crypto.max_batch_delay,
        "max_batch_delay",
        DEFAULT_MAX_BATCH_DELAY,
    )
}
