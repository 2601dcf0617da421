//! What several terminus instances behind one L4 balancer share, so that they behave as
//! one server: the session-ticket keys (a client resumes on whichever instance it
//! reaches).
//!
//! - [`tickets`]: ticket keys by epoch, and the rustls ticketer that seals and opens
//!   tickets with them. Alone, an instance makes its own keys; in a fleet the keys come
//!   from the store.
//! - [`store`]: the store (Redis), its settings, and the thread that keeps an instance's
//!   keys in step with it.
//! - [`shares`]: tenants' quotas as the fleet's, each instance enforcing its share.
//! - [`Fleet`]: an instance's membership, started once per process and kept across
//!   reloads; [`StoreSync`], the store's side of it, which the server runs on a thread of
//!   its own until shutdown.

mod error;
pub mod shares;
pub mod store;
pub mod tickets;

#[cfg(test)]
mod testing;

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use terminus_metrics::{Exposition, Render};
use tokio::sync::watch;

pub use error::{KeyFileError, StoreError};

use shares::{Quotas, ShareMetrics, ShareSync, TenantView};
use store::keys::KeyEntries;
use store::sync::{KeySync, StoreMetrics};
use store::StoreSettings;
use tickets::{system_clock, Ring, Rotation, Ticketer};

/// This instance's part in a fleet (or its keys alone, without a store).
pub struct Fleet {
    ticketer: Arc<Ticketer>,
    store: Option<Arc<StoreMetrics>>,
    shares: Option<ShareMetrics>,
    /// The store's rounds, until the server takes them to run ([`Fleet::store_sync`]).
    sync: std::sync::Mutex<Option<StoreSync>>,
}

/// Keeps this instance's ticket keys (and quota shares) in step with the store: what
/// [`StoreSync::run`] does on the thread the server gives it, until told to stop.
pub struct StoreSync {
    sync: KeySync,
    client: redis::Client,
    poll: std::time::Duration,
    shares: Option<ShareSync>,
    runtime: tokio::runtime::Runtime,
    metrics: Arc<StoreMetrics>,
}

impl StoreSync {
    /// Keeps the keys in step until `stop` changes; then the store's connection is
    /// closed and this returns. A panic in a round is caught and logged: this instance
    /// goes on with the keys it holds.
    pub fn run(self, stop: watch::Receiver<bool>) {
        let StoreSync {
            sync,
            client,
            poll,
            shares,
            runtime,
            metrics,
        } = self;
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runtime.block_on(sync.run(client, poll, shares, stop))
        }));
        if ran.is_err() {
            metrics.stopped();
            tracing::error!("fleet: the store's thread stopped after a panic; ticket keys and quota shares are no longer kept in step (restart this instance)");
        }
    }
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("store", &self.store.is_some())
            .finish_non_exhaustive()
    }
}

impl Fleet {
    /// Ticket keys rotated as `rotation` says: this instance's own, or with `store`
    /// shared through it once [`Fleet::store_sync`]'s rounds run. Fails only on settings
    /// that cannot work (unreadable files, a bad URL); an unreachable store is retried
    /// by the rounds.
    pub fn start(
        rotation: Rotation,
        store: Option<&StoreSettings>,
        quotas: Option<Arc<dyn Quotas>>,
    ) -> Result<Self, StoreError> {
        let ring = Arc::new(RwLock::new(Ring::new(rotation)));
        let clock = system_clock();
        let ticketer = Arc::new(Ticketer::new(ring.clone(), clock.clone()));
        let Some(settings) = store else {
            return Ok(Self {
                ticketer,
                store: None,
                shares: None,
                sync: std::sync::Mutex::default(),
            });
        };
        let (client, kek) = settings.open()?;
        let kek = Arc::new(kek);
        let sync = KeySync::new(
            KeyEntries::new(&settings.prefix, rotation),
            kek.clone(),
            ring,
            clock,
        );
        let metrics = sync.metrics();
        let shares = quotas.map(|q| ShareSync::new(instance_id(), &settings.prefix, q, kek));
        let view = shares.as_ref().map(ShareSync::metrics);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(StoreError::Runtime)?;
        let sync = StoreSync {
            sync,
            client,
            poll: settings.poll,
            shares,
            runtime,
            metrics: metrics.clone(),
        };
        tracing::info!(
            "fleet: ticket keys shared through {} (prefix {:?})",
            settings.shown(),
            settings.prefix
        );
        Ok(Self {
            ticketer,
            store: Some(metrics),
            shares: view,
            sync: std::sync::Mutex::new(Some(sync)),
        })
    }

    /// What this instance knows of the fleet's quotas, tenant by tenant (`None` without
    /// a store).
    pub fn shares(&self) -> Option<BTreeMap<String, TenantView>> {
        let metrics = self.shares.as_ref()?;
        Some(metrics.view().lock().expect("fleet view lock").clone())
    }

    /// The store's rounds, to be run on a thread of their own (once: later calls, and an
    /// instance without a store, get `None`).
    pub fn store_sync(&self) -> Option<StoreSync> {
        self.sync
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// The ticketer every TLS configuration of this process seals tickets with.
    pub fn ticketer(&self) -> &Arc<Ticketer> {
        &self.ticketer
    }
}

impl Render for Fleet {
    fn render(&self, out: &mut Exposition) {
        self.ticketer.metrics().render(out);
        if let Some(store) = &self.store {
            store.render(out);
        }
        if let Some(shares) = &self.shares {
            shares.render(out);
        }
    }
}

/// A name for this instance in the store, readable in `terminus capacity`: its host
/// name, process id, and a random part drawn once per process (containers sharing a
/// host's name are each PID 1).
pub fn instance_id() -> String {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let host = terminus_sys::hostname().unwrap_or_else(|_| "host".into());
        let mut random = [0u8; 3];
        let _ = aws_lc_rs::rand::fill(&mut random);
        format!(
            "{host}:{}:{}",
            std::process::id(),
            tickets::key::hex(&random)
        )
    })
    .clone()
}

/// What `terminus check` found wrong with a store.
#[derive(Debug)]
pub enum StoreProblem {
    /// It does not answer now: instances would start and retry (a warning).
    Unreachable(StoreError),
    /// It cannot work: files, URL, or keys that do not open with the key file.
    Wrong(StoreError),
}

/// `terminus check`'s look at a store: it answers, and the ticket keys in it open with
/// the key file. Returns what it found.
pub fn check_store(settings: &StoreSettings, rotation: Rotation) -> Result<String, StoreProblem> {
    let (client, kek) = settings.open().map_err(StoreProblem::Wrong)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StoreProblem::Wrong(StoreError::Runtime(e)))?;
    let entries = KeyEntries::new(&settings.prefix, rotation);
    runtime.block_on(async {
        let fail = |source: redis::RedisError| {
            StoreProblem::Unreachable(StoreError::Unreachable {
                shown: settings.shown(),
                source,
            })
        };
        let mut conn = store::connect(&client, store::TIMEOUT)
            .await
            .map_err(fail)?;
        let now = rotation.epoch_at((system_clock())());
        let found = entries.fetch(&mut conn, now).await.map_err(fail)?;
        let mut keys = 0;
        for (_, name, value) in found {
            if let Some(wrapped) = value {
                if tickets::KeyMaterial::unwrap(&kek, name.as_bytes(), &wrapped).is_none() {
                    return Err(StoreProblem::Wrong(StoreError::KeyDoesNotOpen {
                        shown: settings.shown(),
                        name,
                        key_file: settings.key_file.clone(),
                    }));
                }
                keys += 1;
            }
        }
        Ok(format!(
            "store {} answers; {keys} ticket key(s) of the current epochs there open with the key file",
            settings.shown()
        ))
    })
}
