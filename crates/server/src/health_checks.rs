//! The thread that runs the upstreams' active health checks: one checker per upstream for
//! the whole process (not one per worker, which would multiply the probes), started for
//! the configuration terminus starts with and again for each reloaded one. A checker
//! ends when its upstream is gone.

use std::io;
use std::sync::{Arc, Weak};

use terminus_proxy::Upstream;
use tokio::sync::mpsc;

use crate::service::Thread;
use crate::site::Site;

/// Where new configurations' upstreams are sent to be checked.
pub struct HealthChecks {
    tx: mpsc::UnboundedSender<Vec<Weak<Upstream>>>,
}

impl HealthChecks {
    /// Starts the thread, which runs until it is stopped as a service.
    pub fn start() -> io::Result<(Self, Thread)> {
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<Weak<Upstream>>>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = Thread::spawn("health-checks", move |mut stop| {
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
                        _ = stop.wait_for(|&stop| stop) => return,
                    }
                }
            });
        })?;
        Ok((HealthChecks { tx }, thread))
    }

    /// Checks `site`'s upstreams (those with `health.path`) from now on.
    pub fn watch(&self, site: &Site) {
        let _ = self
            .tx
            .send(site.upstreams.iter().map(Arc::downgrade).collect());
    }
}
