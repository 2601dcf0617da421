//! Keeps an instance's key ring in step with the store, on the fleet's own thread.
//!
//! Each round reads the entries of every epoch the ring holds in one `MGET`, takes the
//! keys it has not seen, and creates the current and next epochs' entries where they are
//! missing (`SET NX`: of instances racing, one writes and the others read its key), so
//! every key is in the store a period before anyone seals with it. A round runs every
//! `poll`, and at once when another instance announces an entry on the channel. The
//! channel alone would not do: messages sent while a subscriber reconnects are lost.
//!
//! When the store cannot be reached the instance goes on with the keys it holds, says so
//! once, and retries with a growing pause; past the last key's epoch the ticketer makes
//! keys of its own (resumption across instances suffers, handshakes never fail). When the
//! store is back, even empty, the first round puts (or finds) one key for the current
//! epoch, and every instance seals with it after its next round.
//!
//! Beside the key rounds, on a connection of their own, run the quota share rounds
//! ([`crate::shares`]): however slow or refused they are, a key round never waits for one.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::{Client, RedisResult};
use terminus_metrics::{Counter, Exposition, Gauge, Render};
use tokio::sync::watch;

use super::keys::KeyEntries;
use crate::shares::{ShareSync, ROUND_BUDGET, TICK};
use crate::tickets::key::{hex, Kek, KeyMaterial};
use crate::tickets::{self, Clock, Ring};

/// What the key sync saw of the store.
#[derive(Debug)]
pub struct StoreMetrics {
    up: Gauge,
    round_trips: Counter,
    errors: Counter,
    foreign: Counter,
    received: Counter,
    created: Counter,
}

impl StoreMetrics {
    fn new() -> Self {
        Self {
            up: Gauge::new(
                "terminus_fleet_store_up",
                "1 while the fleet's store answers, 0 while this instance serves with the keys it holds.",
            ),
            round_trips: Counter::new(
                "terminus_fleet_store_round_trips_total",
                "Commands (or pipelines) sent to the fleet's store.",
            ),
            errors: Counter::new(
                "terminus_fleet_store_errors_total",
                "Connections to the fleet's store that failed or broke.",
            ),
            foreign: Counter::new(
                "terminus_fleet_store_unreadable_keys_total",
                "Ticket key entries in the store that do not open with this instance's key_file.",
            ),
            received: Counter::new(
                "terminus_ticket_keys_received_total",
                "Ticket keys taken from the fleet's store.",
            ),
            created: Counter::new(
                "terminus_ticket_keys_created_total",
                "Ticket keys this instance made and put in the fleet's store.",
            ),
        }
    }

    /// Whether the store answered last time.
    pub fn up(&self) -> bool {
        self.up.get() == 1
    }

    /// The sync stopped for good (its thread panicked): the store is as good as gone.
    pub(crate) fn stopped(&self) {
        self.up.add(-self.up.get());
    }
}

impl Render for StoreMetrics {
    fn render(&self, out: &mut Exposition) {
        for series in [
            &self.round_trips as &dyn Render,
            &self.errors,
            &self.foreign,
            &self.received,
            &self.created,
            &self.up,
        ] {
            series.render(out);
        }
    }
}

/// One instance's side of the keys in the store.
pub struct KeySync {
    entries: KeyEntries,
    kek: Arc<Kek>,
    ring: Arc<RwLock<Ring>>,
    clock: Clock,
    metrics: Arc<StoreMetrics>,
    /// Entries already reported unusable.
    said: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// Whether `e` lost the connection (as opposed to the store refusing one command).
fn lost(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal()
}

/// The shortest time between two key rounds, whatever is announced on the channel.
const MIN_ROUND: Duration = Duration::from_millis(100);

impl KeySync {
    /// Syncs `ring` with the entries `entries` names, wrapped under `kek`.
    pub fn new(entries: KeyEntries, kek: Arc<Kek>, ring: Arc<RwLock<Ring>>, clock: Clock) -> Self {
        Self {
            entries,
            kek,
            ring,
            clock,
            metrics: Arc::new(StoreMetrics::new()),
            said: Default::default(),
        }
    }

    /// Its counters.
    pub fn metrics(&self) -> Arc<StoreMetrics> {
        self.metrics.clone()
    }

    /// One round (see the module documentation).
    pub async fn round(&self, conn: &mut MultiplexedConnection) -> RedisResult<()> {
        let unix = (self.clock)();
        let now = tickets::read(&self.ring).rotation().epoch_at(unix);
        self.metrics.round_trips.inc();
        for (epoch, name, value) in self.entries.fetch(conn, now).await? {
            let made = match value {
                Some(wrapped) => {
                    self.take(epoch, &name, &wrapped, now);
                    Ok(())
                }
                None if epoch >= now => self.create(epoch, &name, unix, now, conn).await,
                None => Ok(()),
            };
            match made {
                // What the store refused (an entry of the wrong type, say) spoils one
                // epoch's sharing, not the connection: this instance seals with a key of
                // its own for it meanwhile.
                Err(e) if !lost(&e) => self.bad_entry(&name, &e.to_string()),
                other => other?,
            }
        }
        // Keys past `keep` go now, not at the next handshake: an idle instance must not
        // keep them.
        tickets::write(&self.ring).advance(now);
        Ok(())
    }

    /// An entry that cannot be used, said once per entry name.
    fn bad_entry(&self, name: &str, why: &str) {
        self.metrics.foreign.inc();
        let mut said = self
            .said
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if said.len() > 64 {
            said.clear();
        }
        if said.insert(name.to_owned()) {
            tracing::error!("fleet: ticket key entry {name} in the store cannot be used ({why}): this instance seals with keys of its own for that epoch");
        }
    }

    /// Takes the key in `wrapped`, `name`'s entry, into the ring.
    fn take(&self, epoch: u64, name: &str, wrapped: &[u8], now: u64) {
        let Some(material) = KeyMaterial::unwrap(&self.kek, name.as_bytes(), wrapped) else {
            self.bad_entry(
                name,
                "it does not open with this instance's key_file: every instance of a fleet needs the same key_file",
            );
            return;
        };
        let mut ring = tickets::write(&self.ring);
        let replaced = ring.replaced(epoch, &material.name());
        if ring.insert_shared(epoch, &material, now) {
            self.metrics.received.inc();
            if replaced {
                tracing::warn!("fleet: the store's ticket key for epoch {epoch} changed: was it emptied, failed over to a replica behind, or evicting? (give it maxmemory-policy noeviction)");
            }
            tracing::debug!(
                "fleet: ticket key {} for epoch {epoch}",
                hex(&material.name())
            );
        }
    }

    /// Makes `epoch`'s entry, or takes the one another instance made first.
    async fn create(
        &self,
        epoch: u64,
        name: &str,
        unix: u64,
        now: u64,
        conn: &mut MultiplexedConnection,
    ) -> RedisResult<()> {
        let material = KeyMaterial::generate();
        let wrapped = material.wrap(&self.kek, name.as_bytes());
        self.metrics.round_trips.inc();
        let set: Option<String> = redis::cmd("SET")
            .arg(name)
            .arg(&wrapped)
            .arg("NX")
            .arg("EX")
            .arg(self.entries.ttl(epoch, unix))
            .query_async(conn)
            .await?;
        if set.is_some() {
            self.metrics.created.inc();
            self.take(epoch, name, &wrapped, now);
            self.metrics.round_trips.inc();
            let _: i64 = redis::cmd("PUBLISH")
                .arg(self.entries.channel())
                .arg(epoch)
                .query_async(conn)
                .await?;
        } else {
            self.metrics.round_trips.inc();
            let theirs: Option<Vec<u8>> = redis::cmd("GET").arg(name).query_async(conn).await?;
            if let Some(wrapped) = theirs {
                self.take(epoch, name, &wrapped, now);
            }
        }
        Ok(())
    }

    /// Rounds until `stop` (and, with `shares`, a share round every [`TICK`]),
    /// reconnecting whenever the store goes away: after 100 ms, then twice as long each
    /// time up to a second.
    pub async fn run(
        self,
        client: Client,
        poll: Duration,
        mut shares: Option<ShareSync>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut pause = Duration::from_millis(100);
        loop {
            let result = tokio::select! {
                r = self.session(&client, poll, shares.as_mut()) => r,
                _ = stop.changed() => return,
            };
            if let Err(e) = result {
                self.metrics.errors.inc();
                if self.metrics.up() || self.metrics.errors.get() == 1 {
                    tracing::warn!("fleet: the store is unreachable ({e}); serving with the ticket keys and quota shares held, retrying");
                    pause = Duration::from_millis(100);
                }
                self.metrics.up.add(-self.metrics.up.get());
            }
            if let Some(shares) = shares.as_mut() {
                shares.outage();
            }
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                _ = stop.changed() => return,
            }
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// One connection's life: subscribe, then a key round every `poll` or on news; and,
    /// beside it, the share rounds (see [`KeySync::share_rounds`]).
    async fn session(
        &self,
        client: &Client,
        poll: Duration,
        shares: Option<&mut ShareSync>,
    ) -> RedisResult<()> {
        let mut conn = super::connect(client, super::ROUND_TIMEOUT).await?;
        let subscribed = tokio::time::timeout(super::ROUND_TIMEOUT, async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(self.entries.channel()).await?;
            Ok::<_, redis::RedisError>(pubsub)
        });
        let mut pubsub = subscribed.await.map_err(|_| {
            redis::RedisError::from((redis::ErrorKind::Io, "subscribing timed out"))
        })??;
        let mut news = pubsub.on_message();
        self.round(&mut conn).await?;
        if !self.metrics.up() {
            tracing::info!("fleet: the store answers; ticket keys and quotas shared");
            self.metrics.up.add(1 - self.metrics.up.get());
        }
        let keys = async {
            let mut keys_due = tokio::time::Instant::now() + poll;
            let mut last_round = tokio::time::Instant::now();
            loop {
                tokio::select! {
                    message = news.next() => {
                        if message.is_none() {
                            return Err(redis::RedisError::from((
                                redis::ErrorKind::Io,
                                "the subscription closed",
                            )));
                        }
                        // Announcements coalesce: one round for a burst of them.
                        let soonest = last_round + MIN_ROUND;
                        keys_due = keys_due.min(soonest.max(tokio::time::Instant::now()));
                    }
                    () = tokio::time::sleep_until(keys_due) => {
                        last_round = tokio::time::Instant::now();
                        self.round(&mut conn).await?;
                        keys_due = tokio::time::Instant::now() + poll;
                    }
                }
            }
        };
        match shares {
            None => keys.await,
            Some(shares) => tokio::select! {
                ended = keys => ended,
                never = self.share_rounds(client, shares) => match never {},
            },
        }
    }

    /// A share round every [`TICK`], for as long as the key rounds go on. They have a
    /// connection of their own, so that a slow one (a store that stalls writes, a hash
    /// grown huge) never holds up a key round queued behind it; each is given up after
    /// [`ROUND_BUDGET`], its connection with it. One that fails or is given up ends
    /// nothing: the shares hold, then split evenly, as in an outage, and the next tick
    /// tries again (a store gone for good ends the key rounds, and the session).
    async fn share_rounds(
        &self,
        client: &Client,
        shares: &mut ShareSync,
    ) -> std::convert::Infallible {
        let mut conn = None;
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.metrics.round_trips.inc();
            let round = async {
                let conn = match &mut conn {
                    Some(conn) => conn,
                    None => conn.insert(super::connect(client, super::ROUND_TIMEOUT).await?),
                };
                shares.round(conn).await
            };
            let failed = match tokio::time::timeout(ROUND_BUDGET, round).await {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => {
                    if lost(&e) {
                        conn = None;
                    }
                    e.to_string()
                }
                Err(_) => {
                    // Rounds queued behind one the store has not answered would wait as
                    // long: the next starts on a new connection.
                    conn = None;
                    format!("no answer within {ROUND_BUDGET:?}")
                }
            };
            shares.failed(&failed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use terminus_testkit::eventually;

    use super::*;
    use crate::shares::ShareMetrics;
    use crate::testing::{kek, Redis, Steady, Store};
    use crate::tickets::{system_clock, Rotation};

    /// A key sync (a week's epochs: no entry to make while a test runs) and a share sync
    /// for tenant t, run on a thread of their own against `redis` until the sender
    /// returned is dropped.
    fn start(
        redis: &Redis,
    ) -> (
        Arc<StoreMetrics>,
        ShareMetrics,
        watch::Sender<bool>,
        std::thread::JoinHandle<()>,
    ) {
        let rotation = Rotation {
            rotate: Rotation::MAX_LIFETIME,
            keep: 2,
        };
        let kek = Arc::new(kek());
        let sync = KeySync::new(
            KeyEntries::new("terminus:", rotation),
            kek.clone(),
            Arc::new(RwLock::new(Ring::new(rotation))),
            system_clock(),
        );
        let shares = ShareSync::new(
            "me".into(),
            "terminus:",
            Steady::new(&[("t", 10.0)], 100.0),
            kek,
        );
        let (metrics, share_metrics) = (sync.metrics(), shares.metrics());
        let (stop, stopped) = watch::channel(false);
        let client = redis.client();
        let thread = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(sync.run(client, Duration::from_millis(100), Some(shares), stopped))
        });
        eventually(Duration::from_secs(5), "the store up", || metrics.up());
        (metrics, share_metrics, stop, thread)
    }

    #[test]
    fn a_stalled_share_round_neither_ends_the_key_session_nor_holds_up_its_rounds() {
        let Some(redis) = Redis::start() else { return };
        let (metrics, shares, stop, thread) = start(&redis);
        eventually(Duration::from_secs(5), "a share round through", || {
            shares.view().lock().unwrap().contains_key("t")
        });
        redis.cli(&["CONFIG", "RESETSTAT"]);
        // Writes wait, reads go on: each share round's HSET stalls, a key round's MGET
        // (both epochs' entries made) does not.
        redis.cli(&["CLIENT", "PAUSE", "1500", "WRITE"]);
        std::thread::sleep(Duration::from_millis(1300));
        let key_rounds = redis.calls("mget");
        assert!(
            key_rounds >= 6,
            "{key_rounds} key rounds in 1.3 s of stalled share rounds, polling every 100 ms"
        );
        eventually(Duration::from_secs(5), "a share round given up", || {
            shares.failed() >= 1
        });
        assert_eq!(metrics.errors.get(), 0, "the key session ended");
        assert!(metrics.up());
        drop(stop);
        thread.join().unwrap();
    }

    #[test]
    fn a_quota_entry_of_the_wrong_type_fails_share_rounds_not_the_key_session() {
        let Some(redis) = Redis::start() else { return };
        redis.cli(&["SET", "terminus:quota:t", "not a hash"]);
        let (metrics, shares, stop, thread) = start(&redis);
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(metrics.errors.get(), 0, "the key session ended");
        assert!(
            shares.failed() >= 5,
            "{} share rounds failed",
            shares.failed()
        );
        assert!(metrics.up());
        drop(stop);
        thread.join().unwrap();
    }
}
