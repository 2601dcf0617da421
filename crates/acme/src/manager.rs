//! The ACME thread: every server's certificates of both key types kept issued and
//! renewed, each by a task of its own on one current-thread runtime (`acme`), apart from
//! the workers, which only read [`Challenges`] and the files it writes.
//!
//! A task's loop: in a fleet, first take the store's copy if it is newer than ours (or
//! give ours if the store's is older); then read the stored certificate; if it serves
//! (valid, for exactly the server's names), ask ARI for the window and sleep until the
//! renewal point (or the CA's next ARI poll, whichever is first: the window may move);
//! else order now, in a fleet only under the server's lock (an instance that finds it
//! held waits for the holder's certificate to reach the store). An issued certificate
//! is stored and the server told, so that it goes live by the reload path without
//! dropping a connection. A failure waits the backoff while the old certificate (or,
//! before any, the self-signed one) keeps being served; a certificate issued but not
//! written is written again, not ordered again.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use instant_acme::{
    Account, AccountBuilder, AccountCredentials, CertificateIdentifier, ExternalAccountKey,
    NewAccount,
};
use terminus_fleet::store::StoreSettings;
use zeroize::Zeroizing;

use crate::challenges::Challenges;
use crate::fleet::{FleetStore, FleetStoreError};
use crate::http::{CaClient, CaError};
use crate::issuer::{self, Issued, OrderError};
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

/// How long an instance that found a server's lock held waits before looking again.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// In a fleet, how often a certificate waiting for its renewal looks for a newer copy
/// in the store (another instance's renewal).
const FLEET_LOOK: Duration = Duration::from_secs(60);

/// Why the ACME thread cannot be made ([`Acme::new`]).
#[derive(Debug, thiserror::Error)]
pub enum AcmeError {
    /// The state directory cannot be written.
    #[error("[acme] state_dir {} cannot be written ({source}): an order's account and certificates would be lost, and each retry would be a new issuance", dir.display())]
    StateDir {
        /// The state directory.
        dir: std::path::PathBuf,
        /// What writing in it said.
        #[source]
        source: std::io::Error,
    },
    /// The fleet's store settings cannot work.
    #[error(transparent)]
    Fleet(#[from] terminus_fleet::StoreError),
    /// The CA's client cannot be made (a private CA's root, the system's roots).
    #[error("[acme] ca: {0}")]
    Ca(#[source] CaError),
    /// The thread's runtime cannot be made.
    #[error(transparent)]
    Runtime(std::io::Error),
}

/// Why this instance's copy of a certificate and the fleet's store's could not be
/// brought in step.
#[derive(Debug, thiserror::Error)]
enum SyncError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] FleetStoreError),
    /// The store's certificate could not be written to the state directory.
    #[error("storing the fleet's certificate: {0}")]
    Save(#[source] std::io::Error),
    /// Ours could not be read from the state directory.
    #[error(transparent)]
    Read(std::io::Error),
    /// Ours was gone between two readings.
    #[error("the certificate just read is gone")]
    Gone,
}

/// The ACME thread, made once for the process and started when the listeners are up
/// (the CA validates at once, and a challenge it cannot reach is an order failed).
pub struct Acme {
    metrics: Arc<AcmeMetrics>,
    ready: std::sync::Mutex<Option<Unstarted>>,
}

/// The longest a stop waits for work on the runtime's blocking pool (a DNS lookup).
const STOP_WAIT: Duration = Duration::from_millis(500);

/// What the thread takes when it starts.
struct Unstarted {
    shared: Arc<Shared>,
    targets: Vec<Target>,
    runtime: tokio::runtime::Runtime,
}

impl std::fmt::Debug for Acme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acme").finish_non_exhaustive()
    }
}

/// Told when a certificate was stored: the server reloads.
pub type OnIssued = Arc<dyn Fn() + Send + Sync>;

impl Acme {
    /// Readies the thread that keeps `targets`' certificates, answering challenges
    /// through `challenges` and calling `on_issued` after storing each new certificate;
    /// with `fleet`, sharing them through its store. Fails on a state directory that
    /// cannot be written or a store that cannot be opened.
    pub fn new(
        settings: AcmeSettings,
        targets: Vec<Target>,
        fleet: Option<&StoreSettings>,
        challenges: Arc<Challenges>,
        on_issued: OnIssued,
    ) -> Result<Self, AcmeError> {
        let state = StateDir::new(&settings.state_dir);
        state.probe().map_err(|source| AcmeError::StateDir {
            dir: settings.state_dir.clone(),
            source,
        })?;
        let fleet = fleet
            .map(|f| FleetStore::open(f).map(Arc::new))
            .transpose()?;
        let ca = CaClient::new(settings.ca.as_deref()).map_err(AcmeError::Ca)?;
        let metrics = Arc::new(AcmeMetrics::default());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(AcmeError::Runtime)?;
        let shared = Arc::new(Shared {
            state,
            settings,
            challenges,
            fleet,
            ca,
            on_issued,
            metrics: metrics.clone(),
        });
        Ok(Self {
            metrics,
            ready: std::sync::Mutex::new(Some(Unstarted {
                shared,
                targets,
                runtime,
            })),
        })
    }

    /// Keeps the certificates (ordering, renewing, mirroring the fleet's challenges)
    /// until `stop` turns true, then returns with its orders and connections dropped. The
    /// server runs it on a thread of its own; once: a second call returns at once.
    pub fn run(&self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let taken = self
            .ready
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let Some(Unstarted {
            shared,
            targets,
            runtime,
        }) = taken
        else {
            return;
        };
        runtime.block_on(async move {
            tokio::select! {
                () = run(shared, targets) => {}
                _ = stop.wait_for(|&stop| stop) => {}
            }
        });
        // A lookup of the CA's name or a key being made on the blocking pool is not waited
        // out at shutdown.
        runtime.shutdown_timeout(STOP_WAIT);
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
    fleet: Option<Arc<FleetStore>>,
    /// How orders reach the CA (and what it said about when to come back).
    ca: CaClient,
    on_issued: OnIssued,
    metrics: Arc<AcmeMetrics>,
}

impl Shared {
    /// The longer of the waits the CA asked for: in the failed exchange, or in any
    /// rate-limited (429) or unavailable (503) answer since.
    fn asked(&self, e: &OrderError) -> Option<Duration> {
        e.retry_after
            .max(self.ca.asked_to_wait().map(|(wait, _)| wait))
    }

    /// What the CA answered when it asked to be left alone, for the failure's log line.
    fn refusal(&self) -> String {
        self.ca
            .asked_to_wait()
            .map(|(wait, status)| {
                format!(
                    " (the CA answered {status} and asked to be left alone for {})",
                    human(wait)
                )
            })
            .unwrap_or_default()
    }
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
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(fleet) = &shared.fleet {
        tasks.spawn(fleet.clone().mirror(shared.challenges.clone()));
    }
    let account = {
        let mut backoff = Backoff::default();
        loop {
            match account(&shared).await {
                Ok(account) => break account,
                Err(e) => {
                    let wait = backoff.failed(shared.asked(&e), draw());
                    tracing::warn!(
                        "acme: no account at {}: {e}{}; trying again in {}",
                        shared.settings.directory,
                        shared.refusal(),
                        human(wait)
                    );
                    tokio::time::sleep(wait).await;
                }
            }
        }
    };
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

fn store_error<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> OrderError + '_ {
    move |e| OrderError {
        message: format!("{what}: {e}"),
        retry_after: None,
    }
}

/// The account: the fleet's (in a fleet), else the state directory's, else a new one,
/// stored at once. In a fleet one instance makes it, under a lock; the others wait
/// for it to reach the store.
async fn account(shared: &Shared) -> Result<Account, OrderError> {
    let settings = &shared.settings;
    let builder = || Account::builder_with_http(Box::new(shared.ca.clone()));
    let Some(fleet) = &shared.fleet else {
        return local_account(shared, builder()).await;
    };
    let entry = FleetStore::account(&settings.directory);
    loop {
        if let Some(json) = fleet
            .get(&entry)
            .await
            .map_err(store_error("the account"))?
        {
            return from_json(builder(), &json).await;
        }
        let Some(lock) = fleet
            .lock(&entry)
            .await
            .map_err(store_error("the account"))?
        else {
            tokio::time::sleep(LOCK_WAIT).await;
            continue;
        };
        let made = async {
            if let Some(json) = fleet
                .get(&entry)
                .await
                .map_err(store_error("the account"))?
            {
                return from_json(builder(), &json).await;
            }
            // This instance's own account, from before it joined a fleet, becomes the
            // fleet's; else a new one.
            let account = local_account(shared, builder()).await?;
            let json = shared
                .state
                .load_account(&settings.directory)
                .map_err(store_error("the account"))?
                .ok_or_else(|| store_error("the account")("not in the state directory"))?;
            fleet
                .put(&entry, &json, None)
                .await
                .map_err(store_error("the account"))?;
            Ok(account)
        }
        .await;
        fleet.unlock(lock).await;
        return made;
    }
}

async fn from_json(builder: AccountBuilder, json: &[u8]) -> Result<Account, OrderError> {
    let credentials: AccountCredentials = serde_json::from_slice(json).map_err(|e| OrderError {
        message: format!("stored account: {e}"),
        retry_after: None,
    })?;
    Ok(builder.from_credentials(credentials).await?)
}

/// The account kept in the state directory, or a new one (stored at once).
async fn local_account(shared: &Shared, builder: AccountBuilder) -> Result<Account, OrderError> {
    let settings = &shared.settings;
    let io = |e: std::io::Error| OrderError {
        message: format!("state directory {}: {e}", settings.state_dir.display()),
        retry_after: None,
    };
    if let Some(json) = shared.state.load_account(&settings.directory).map_err(io)? {
        return from_json(builder, &json).await;
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
    let json = serde_json::to_vec_pretty(&credentials)
        .map(Zeroizing::new)
        .map_err(|e| OrderError {
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

/// In a fleet, brings this instance's copy of `names`' certificate of `kind` and the
/// store's in step: the store's taken if it serves and is newer (stored here and the
/// server told), ours given if the store has none that serves or an older one. Returns
/// whether ours changed.
async fn sync(
    shared: &Shared,
    fleet: &FleetStore,
    names: &[String],
    kind: CertKind,
) -> Result<bool, SyncError> {
    let entry = FleetStore::certificate(names, kind);
    let now = SystemTime::now();
    let ours = shared
        .state
        .load(names, kind)
        .ok()
        .flatten()
        .filter(|s| s.serves(names, now));
    let theirs = match fleet.get(&entry).await? {
        Some(file) => match Stored::parse(shared.state.certificate_path(names, kind), &file) {
            Ok(stored) if stored.serves(names, now) => Some((stored, file)),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!("acme: {entry} in the fleet's store does not parse ({e}); replaced");
                None
            }
        },
        None => None,
    };
    // Newer by issuance, not by expiry: a renewal under a shorter profile expires
    // before the certificate it replaces.
    let newer = |a: &Stored, b: &Stored| a.validity.not_before > b.validity.not_before;
    match (ours, theirs) {
        (Some(ours), Some((theirs, _))) if ours.serial == theirs.serial => Ok(false),
        (ours, Some((theirs, file))) if ours.as_ref().map_or(true, |o| newer(&theirs, o)) => {
            let stored = shared
                .state
                .save(names, kind, &file)
                .map_err(SyncError::Save)?;
            shared.metrics.fleet(true);
            tracing::info!(
                "acme: the {} certificate for {} (serial {}) taken from the fleet's store",
                kind.name(),
                names.join(", "),
                stored.serial
            );
            (shared.on_issued)();
            Ok(true)
        }
        (Some(ours), _) => {
            let file = shared
                .state
                .read(names, kind)
                .map_err(SyncError::Read)?
                .ok_or(SyncError::Gone)?;
            give(shared, fleet, names, kind, &ours, &file).await?;
            Ok(false)
        }
        (None, _) => Ok(false),
    }
}

/// Puts `file` (`stored`'s) in the fleet's store, kept a week past its notAfter.
async fn give(
    shared: &Shared,
    fleet: &FleetStore,
    names: &[String],
    kind: CertKind,
    stored: &Stored,
    file: &[u8],
) -> Result<(), FleetStoreError> {
    let expires = stored.validity.not_after + Duration::from_secs(7 * 86_400);
    fleet
        .put(&FleetStore::certificate(names, kind), file, Some(expires))
        .await?;
    shared.metrics.fleet(false);
    Ok(())
}

/// When the serving certificate renews: ARI's window as last asked, and one draw in it
/// (kept while the certificate and the window are the same, so that waking up early,
/// to look at the fleet's store or for a lock, does not draw again).
struct Plan {
    serial: String,
    window: Option<(SystemTime, SystemTime)>,
    draw: f64,
    ask_again: tokio::time::Instant,
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
    // A certificate issued that the state directory did not take: written again, not
    // ordered again.
    let mut unsaved: Option<Issued> = None;
    let mut plan: Option<Plan> = None;
    let mut fleet_failing = false;
    let look = if shared.fleet.is_some() {
        FLEET_LOOK
    } else {
        Duration::MAX
    };
    loop {
        if let Some(fleet) = &shared.fleet {
            match sync(&shared, fleet, names, kind).await {
                Ok(_) => fleet_failing = false,
                Err(e) if !fleet_failing => {
                    fleet_failing = true;
                    tracing::warn!(
                        "acme: the {} certificate for {label} and the fleet's store: {e}",
                        kind.name()
                    );
                }
                Err(_) => {}
            }
        }
        if let Some(issued) = unsaved.take() {
            match written(&shared, names, kind, issued, &mut unsaved).await {
                Ok(new) => {
                    backoff.succeeded();
                    earliest = after_issuance(&new);
                }
                Err(e) => {
                    let wait = backoff.failed(None, draw());
                    tracing::warn!("acme: the {} certificate for {label} was issued but not stored ({e}); trying again in {}", kind.name(), human(wait));
                    tokio::time::sleep(wait).await;
                }
            }
            continue;
        }
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
            let stale = plan.as_ref().map_or(true, |p| {
                p.serial != current.serial || tokio::time::Instant::now() >= p.ask_again
            });
            if stale {
                let (window, poll) = ari(&account, current).await;
                let draw = match &plan {
                    Some(p) if p.serial == current.serial && p.window == window => p.draw,
                    _ => draw(),
                };
                plan = Some(Plan {
                    serial: current.serial.clone(),
                    window,
                    draw,
                    ask_again: tokio::time::Instant::now() + poll,
                });
            }
            let p = plan.as_ref().expect("planned above");
            let due = renew_at(current.validity, p.window, p.draw).max(earliest);
            shared.metrics.next(label, kind, due);
            if let Ok(wait) = due.duration_since(now) {
                tracing::debug!(
                    "acme: {} certificate for {label} (serial {}) renews in {}{}",
                    kind.name(),
                    current.serial,
                    human(wait),
                    if p.window.is_some() { " (ARI)" } else { "" }
                );
                let ask = p
                    .ask_again
                    .saturating_duration_since(tokio::time::Instant::now());
                tokio::time::sleep(wait.min(ask).min(look)).await;
                continue;
            }
        } else if let Ok(wait) = earliest.duration_since(now) {
            shared.metrics.next(label, kind, earliest);
            tokio::time::sleep(wait.min(look)).await;
            continue;
        } else {
            shared.metrics.next(label, kind, now);
        }
        let replaces = serving
            .as_ref()
            .and_then(|s| CertificateIdentifier::try_from(&s.leaf).ok())
            .map(|id| id.into_owned());
        let ordering = one_order.lock().await;
        let lock = match &shared.fleet {
            None => None,
            Some(fleet) => {
                match fleet
                    .lock(&format!("order:{}", label.to_ascii_lowercase()))
                    .await
                {
                    Ok(Some(lock)) => {
                        // The holder before us may have just stored what we were about to
                        // order.
                        if sync(&shared, fleet, names, kind).await.unwrap_or(false) {
                            fleet.unlock(lock).await;
                            continue;
                        }
                        Some(lock)
                    }
                    Ok(None) => {
                        // Another instance orders, or waits out its failure's backoff.
                        drop(ordering);
                        tracing::debug!("acme: another instance orders for {label}; waiting for its {} certificate", kind.name());
                        tokio::time::sleep(LOCK_WAIT).await;
                        continue;
                    }
                    Err(e) if serving.as_ref().is_some_and(expiring) => {
                        tracing::warn!("acme: the fleet's store cannot order the {} certificate for {label} ({e}) and it expires within a tenth of its lifetime: ordering it on this instance alone", kind.name());
                        None
                    }
                    Err(e) => {
                        drop(ordering);
                        let wait = backoff.failed(None, draw());
                        shared.metrics.next(label, kind, SystemTime::now() + wait);
                        tracing::warn!("acme: the {} certificate for {label} is due but the fleet's store cannot order it ({e}); trying again in {}", kind.name(), human(wait));
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                }
            }
        };
        let ordered = issuer::issue(
            &account,
            &shared.settings,
            &shared.challenges,
            shared.fleet.as_deref(),
            names,
            kind,
            replaces,
        )
        .await;
        let outcome = match ordered {
            Ok(issued) => written(&shared, names, kind, issued, &mut unsaved)
                .await
                .map_err(|e| OrderError {
                    message: format!("issued, but not stored: {e}"),
                    retry_after: None,
                }),
            Err(e) => Err(e),
        };
        match outcome {
            Ok(new) => {
                if let (Some(fleet), Some(lock)) = (&shared.fleet, lock) {
                    fleet.unlock(lock).await;
                }
                drop(ordering);
                shared.metrics.ordered(true);
                backoff.succeeded();
                earliest = after_issuance(&new);
            }
            Err(e) => {
                shared.metrics.ordered(unsaved.is_some());
                let wait = backoff.failed(shared.asked(&e), draw());
                // The fleet waits with us: the lock lapses when our backoff ends, so
                // that N instances do not make N times the failed attempts the CA
                // counts against the names.
                if let (Some(fleet), Some(lock)) = (&shared.fleet, lock) {
                    fleet.hold(lock, wait).await;
                }
                drop(ordering);
                shared.metrics.next(label, kind, SystemTime::now() + wait);
                tracing::warn!(
                    "acme: ordering the {} certificate for {} failed ({} in a row): {e}{}; trying again in {}, {} meanwhile",
                    kind.name(),
                    names.join(", "),
                    backoff.failures(),
                    shared.refusal(),
                    human(wait),
                    if serving.is_some() { "the current certificate served" } else { "the self-signed certificate served" }
                );
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// No other order before a tenth of `new`'s lifetime.
fn after_issuance(new: &Stored) -> SystemTime {
    SystemTime::now() + (new.validity.lifetime() / 10).max(Duration::from_secs(1))
}

/// Whether `current` has less than a tenth of its lifetime left: too late to wait for a
/// fleet's store to come back.
fn expiring(current: &Stored) -> bool {
    let left = current
        .validity
        .not_after
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    left < current.validity.lifetime() / 10
}

/// Stores `issued` here, then gives it to the fleet's store; the server told. What the
/// state directory did not take is left in `unsaved`; a store that did not take it
/// gets it from the next [`sync`].
async fn written(
    shared: &Shared,
    names: &[String],
    kind: CertKind,
    issued: Issued,
    unsaved: &mut Option<Issued>,
) -> std::io::Result<Stored> {
    let new = match shared.state.save(names, kind, issued.0.as_bytes()) {
        Ok(new) => new,
        Err(e) => {
            *unsaved = Some(issued);
            return Err(e);
        }
    };
    tracing::info!(
        "acme: issued the {} certificate for {} (serial {}, valid until {})",
        kind.name(),
        names.join(", "),
        new.serial,
        httpdate(new.validity.not_after)
    );
    (shared.on_issued)();
    if let Some(fleet) = &shared.fleet {
        if let Err(e) = give(shared, fleet, names, kind, &new, issued.0.as_bytes()).await {
            tracing::warn!("acme: the {} certificate for {} is not in the fleet's store yet ({e}); given again on the next look", kind.name(), names[0]);
        }
    }
    Ok(new)
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
