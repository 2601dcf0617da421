//! The thread that runs the upstreams' active health checks: one checker per upstream for
//! the whole process (not one per worker, which would multiply the probes), started for
//! the configuration terminus starts with and again for each reloaded one. A checker
//! ends when its upstream is gone.

use std::io;
use std::sync::{Arc, Weak};

use terminus_proxy::Upstream;
use tokio::sync::{mpsc, watch};

use crate::site::Site;

/// Where new configurations' upstreams are sent to be checked.
pub struct HealthChecks {
    tx: mpsc::UnboundedSender<Vec<Weak<Upstream>>>,
}

impl HealthChecks {
    /// Starts the thread; it ends when `shutdown` turns true.
    pub fn start(mut shutdown: watch::Receiver<bool>) -> io::Result<Self> {
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<Weak<Upstream>>>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("health-checks".into())
            .spawn(move || {
                let local = tokio::task::LocalSet::new();
                local.block_on(&runtime, async move {
                    loop {
                        tokio::select! {
                            upstreams = rx.recv() => match upstreams {
                                Some(upstreams) => {
                                    for upstream in upstreams {
                                        tokio::task::spawn_local(terminus_proxy::checks::run(upstream));
                                    }
                                }
                                None => return,
                            },
                            _ = shutdown.wait_for(|&stop| stop) => return,
                        }
                    }
                });
            })?;
        Ok(HealthChecks { tx })
    }

    /// Checks `site`'s upstreams (those with `health.path`) from now on.
    pub fn watch(&self, site: &Site) {
        let _ = self
            .tx
            .send(site.upstreams.iter().map(Arc::downgrade).collect());
    }
}
