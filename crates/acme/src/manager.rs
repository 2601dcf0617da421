//! The ACME thread: every server's certificates of both key types kept issued and
//! renewed, each by a task of its own on one current-thread runtime (`acme`), apart from
//! the workers, which only read [`Challenges`] and the files it writes.
//!
//! A task's loop: read the stored certificate; if it serves (valid, for exactly the
//! server's names), ask ARI for the window and sleep until the renewal point (or the
//! CA's next ARI poll, whichever is first: the window may move); else order now. An
//! issued certificate is stored and the server told, so that it goes live by the reload
//! path without dropping a connection. A failure waits the backoff while the old
//! certificate (or, before any, the self-signed one) keeps being served.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use instant_acme::{
    Account, AccountCredentials, CertificateIdentifier, ExternalAccountKey, NewAccount,
};

use crate::challenges::Challenges;
use crate::issuer::{self, OrderError};
use crate::metrics::AcmeMetrics;
use crate::schedule::{renew_at, Backoff};
use crate::settings::AcmeSettings;
use crate::store::{CertKind, StateDir, Stored};

/// ARI is asked again at least this often while a certificate waits for its renewal
/// (RFC 9773 section 4.3.2: the CA's Retry-After, within bounds the client sets).
const ARI_POLL_MAX: Duration = Duration::from_secs(6 * 3600);
const ARI_POLL_MIN: Duration = Duration::from_secs(60);

/// One server's certificates to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Its names, the first naming it in files, logs and metrics.
    pub names: Vec<String>,
}

/// The ACME thread, started once for the process.
pub struct Acme {
    metrics: Arc<AcmeMetrics>,
}

impl std::fmt::Debug for Acme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acme").finish_non_exhaustive()
    }
}

/// Told when a certificate was stored: the server reloads.
pub type OnIssued = Arc<dyn Fn() + Send + Sync>;

impl Acme {
    /// Starts the thread that keeps `targets`' certificates, answering challenges
    /// through `challenges` and calling `on_issued` after storing each new certificate.
    pub fn start(
        settings: AcmeSettings,
        targets: Vec<Target>,
        challenges: Arc<Challenges>,
        on_issued: OnIssued,
    ) -> std::io::Result<Self> {
        let state = StateDir::new(&settings.state_dir);
        state.probe().map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "[acme] state_dir {} cannot be written ({e}): an order's account and certificates would be lost, and each retry would be a new issuance",
                    settings.state_dir.display()
                ),
            )
        })?;
        let metrics = Arc::new(AcmeMetrics::default());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let shared = Arc::new(Shared {
            state,
            settings,
            challenges,
            on_issued,
            metrics: metrics.clone(),
        });
        std::thread::Builder::new()
            .name("acme".into())
            .spawn(move || runtime.block_on(run(shared, targets)))?;
        Ok(Self { metrics })
    }

    /// Its series, for `/metrics`.
    pub fn metrics(&self) -> Arc<AcmeMetrics> {
        self.metrics.clone()
    }
}

struct Shared {
    settings: AcmeSettings,
    state: StateDir,
    challenges: Arc<Challenges>,
    on_issued: OnIssued,
    metrics: Arc<AcmeMetrics>,
}

/// A uniform draw in [0, 1) from the system's CSPRNG.
fn draw() -> f64 {
    let mut bytes = [0u8; 8];
    if aws_lc_rs::rand::fill(&mut bytes).is_err() {
        return 0.5;
    }
    (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64
}

async fn run(shared: Arc<Shared>, targets: Vec<Target>) {
    let account = {
        let mut backoff = Backoff::default();
        loop {
            match account(&shared).await {
                Ok(account) => break account,
                Err(e) => {
                    let wait = backoff.failed(e.retry_after, draw());
                    tracing::warn!(
                        "acme: no account at {}: {e}; trying again in {}",
                        shared.settings.directory,
                        human(wait)
                    );
                    tokio::time::sleep(wait).await;
                }
            }
        }
    };
    let mut tasks = tokio::task::JoinSet::new();
    for target in targets {
        // A server's two orders go one at a time: TLS-ALPN-01 answers by name, so two
        // orders proving the same name at once would overwrite each other's answer.
        let one_order = Arc::new(tokio::sync::Mutex::new(()));
        for kind in CertKind::ALL {
            let task = keep(
                shared.clone(),
                account.clone(),
                target.clone(),
                kind,
                one_order.clone(),
            );
            tasks.spawn(task);
        }
    }
    while tasks.join_next().await.is_some() {}
}

/// The account kept in the state directory, or a new one (stored at once).
async fn account(shared: &Shared) -> Result<Account, OrderError> {
    let settings = &shared.settings;
    let builder = match &settings.ca {
        Some(ca) => Account::builder_with_root(ca)?,
        None => Account::builder()?,
    };
    let io = |e: std::io::Error| OrderError {
        message: format!("state directory {}: {e}", settings.state_dir.display()),
        retry_after: None,
    };
    if let Some(json) = shared.state.load_account(&settings.directory).map_err(io)? {
        let credentials: AccountCredentials =
            serde_json::from_slice(&json).map_err(|e| OrderError {
                message: format!("stored account: {e}"),
                retry_after: None,
            })?;
        return Ok(builder.from_credentials(credentials).await?);
    }
    let contact: Vec<&str> = settings.contact.iter().map(String::as_str).collect();
    let eab = settings
        .eab
        .as_ref()
        .map(|e| ExternalAccountKey::new(e.kid.clone(), &e.hmac_key));
    let (account, credentials) = builder
        .create(
            &NewAccount {
                contact: &contact,
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            settings.directory.clone(),
            eab.as_ref(),
        )
        .await?;
    let json = serde_json::to_vec_pretty(&credentials).map_err(|e| OrderError {
        message: format!("account credentials: {e}"),
        retry_after: None,
    })?;
    shared
        .state
        .save_account(&settings.directory, &json)
        .map_err(io)?;
    tracing::info!(
        "acme: account {} created at {}",
        account.id(),
        settings.directory
    );
    Ok(account)
}

/// Keeps `target`'s certificate of `kind` issued and renewed, forever.
async fn keep(
    shared: Arc<Shared>,
    account: Account,
    target: Target,
    kind: CertKind,
    one_order: Arc<tokio::sync::Mutex<()>>,
) {
    let names = &target.names;
    let label = names[0].as_str();
    let mut backoff = Backoff::default();
    // After an issuance, no other order before a tenth of its lifetime: a certificate
    // that does not count as serving at once (a clock behind the CA's notBefore, an ARI
    // window already past) must not be ordered again and again.
    let mut earliest = SystemTime::UNIX_EPOCH;
    loop {
        let stored = match shared.state.load(names, kind) {
            Ok(stored) => stored,
            Err(e) => {
                tracing::warn!(
                    "acme: stored {} certificate for {label} unreadable ({e}); ordering a new one",
                    kind.name()
                );
                None
            }
        };
        let now = SystemTime::now();
        let serving = stored.filter(|s| s.serves(names, now));
        if let Some(current) = &serving {
            shared
                .metrics
                .expires(label, kind, current.validity.not_after);
            let (window, poll) = ari(&account, current).await;
            let due = renew_at(current.validity, window, draw()).max(earliest);
            shared.metrics.next(label, kind, due);
            if let Ok(wait) = due.duration_since(now) {
                tracing::debug!(
                    "acme: {} certificate for {label} (serial {}) renews in {}{}",
                    kind.name(),
                    current.serial,
                    human(wait),
                    if window.is_some() { " (ARI)" } else { "" }
                );
                tokio::time::sleep(wait.min(poll)).await;
                continue;
            }
        } else if let Ok(wait) = earliest.duration_since(now) {
            shared.metrics.next(label, kind, earliest);
            tokio::time::sleep(wait).await;
            continue;
        } else {
            shared.metrics.next(label, kind, now);
        }
        let replaces = serving
            .as_ref()
            .and_then(|s| CertificateIdentifier::try_from(&s.leaf).ok())
            .map(|id| id.into_owned());
        let ordering = one_order.lock().await;
        let ordered = issuer::issue(
            &account,
            &shared.settings,
            &shared.challenges,
            names,
            kind,
            replaces,
        )
        .await;
        drop(ordering);
        let stored = ordered.and_then(|issued| {
            shared
                .state
                .save(names, kind, &issued.key_pem, &issued.chain_pem)
                .map_err(|e| OrderError {
                    message: format!("storing it: {e}"),
                    retry_after: None,
                })
        });
        match stored {
            Ok(new) => {
                shared.metrics.ordered(true);
                backoff.succeeded();
                let gap = (new.validity.lifetime() / 10).max(Duration::from_secs(1));
                earliest = SystemTime::now() + gap;
                tracing::info!(
                    "acme: issued the {} certificate for {} (serial {}, valid until {})",
                    kind.name(),
                    names.join(", "),
                    new.serial,
                    httpdate(new.validity.not_after)
                );
                (shared.on_issued)();
            }
            Err(e) => {
                shared.metrics.ordered(false);
                let wait = backoff.failed(e.retry_after, draw());
                shared.metrics.next(label, kind, SystemTime::now() + wait);
                tracing::warn!(
                    "acme: ordering the {} certificate for {} failed ({} in a row): {e}; trying again in {}, {} meanwhile",
                    kind.name(),
                    names.join(", "),
                    backoff.failures(),
                    human(wait),
                    if serving.is_some() { "the current certificate served" } else { "the self-signed certificate served" }
                );
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// ARI's window for `current`, if the CA has ARI, and when to ask again.
async fn ari(account: &Account, current: &Stored) -> (Option<(SystemTime, SystemTime)>, Duration) {
    let Ok(id) = CertificateIdentifier::try_from(&current.leaf) else {
        return (None, ARI_POLL_MAX);
    };
    match account.renewal_info(&id).await {
        Ok((info, retry_after)) => {
            let at = |t: time::OffsetDateTime| {
                let secs = t.unix_timestamp().max(0) as u64;
                SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
            };
            let window = (
                at(info.suggested_window.start),
                at(info.suggested_window.end),
            );
            (Some(window), retry_after.clamp(ARI_POLL_MIN, ARI_POLL_MAX))
        }
        Err(instant_acme::Error::Unsupported(_)) => (None, ARI_POLL_MAX),
        Err(e) => {
            tracing::debug!(
                "acme: renewal information for serial {}: {e}",
                current.serial
            );
            (None, ARI_POLL_MIN)
        }
    }
}

fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} days", s / 86_400),
    }
}

fn httpdate(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    time::OffsetDateTime::from_unix_timestamp(secs as i64)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| format!("{secs}"))
}
