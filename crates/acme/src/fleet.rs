//! ACME in a fleet: the account and the certificates kept in the fleet's store, so that
//! every instance serves the same certificate and one order is placed per certificate,
//! not one per instance; and the challenge answers shared, so that the CA's validation
//! may reach any instance behind the balancer.
//!
//! ```text
//! <prefix>acme:account:<directory hash>      the account (instant-acme's credentials), sealed
//! <prefix>acme:cert:<first name>:<kind>      key and chain, PEM, sealed; gone a week after notAfter
//! <prefix>acme:lock:<what>                   the instance ordering it, for at most LOCK_TTL
//! <prefix>acme:challenges                    a hash: "http-01 <token>" or "tls-alpn-01 <name>"
//!                                            to "<expiry> <instance> <key authorization>", sealed
//! ```
//!
//! Everything is sealed under the fleet's key file ([`Kek`]) with the entry's name (and a
//! challenge's field) as additional data, as ticket keys are: the store's readers learn
//! nothing, an entry copied under another name does not open, and whoever can write to
//! the store without the key file cannot make the fleet answer a challenge for an order
//! of theirs.
//!
//! The lock is Redis's `SET NX PX` with a random token, released only by its holder. It
//! orders names, it does not guard correctness: a holder that outlives it makes, at
//! worst, one certificate more, and every instance keeps the newest one it finds.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use redis::aio::MultiplexedConnection;
use redis::Client;
use terminus_error::{Classify, Source};
use terminus_fleet::store::StoreSettings;
use terminus_fleet::tickets::key::{hex, Kek};
use terminus_fleet::StoreError;
use zeroize::Zeroizing;

use crate::challenges::{ChallengeError, Challenges, Published, Whose};
use crate::store::CertKind;

/// How long a lock holds without its holder: longer than an order may take (two
/// polls of at most 90 s each, and the requests around them).
const LOCK_TTL: Duration = Duration::from_secs(600);

/// How long a challenge answer stays in the store if its order never withdraws it (the
/// instance died): past any validation the CA may still make.
const CHALLENGE_TTL: Duration = Duration::from_secs(600);

/// Other instances' answers are read at `[fleet] poll`, but at least this often: an
/// order waits two reads before telling the CA, well within the TTLs above.
const LOOK_MAX: Duration = Duration::from_secs(5);

/// Why the fleet's store did not do what ACME asked of it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FleetStoreError {
    /// No connection to it.
    #[error("the fleet's store: {0}")]
    Connect(#[source] redis::RedisError),
    /// A command failed (the connection is made anew for the next one).
    #[error("the fleet's store: {0}")]
    Command(#[source] redis::RedisError),
    /// An entry does not open with this instance's key file.
    #[error("{name} in the fleet's store does not open with [fleet] key_file: every instance needs the same one")]
    DoesNotOpen {
        /// The entry's name in the store.
        name: String,
    },
    /// No random bytes for a lock's token.
    #[error("no randomness")]
    NoRandomness,
}

impl Classify for FleetStoreError {
    fn kind(&self) -> &'static str {
        match self {
            Self::Connect(_) => "store_unreachable",
            Self::Command(_) => "store_command",
            Self::DoesNotOpen { .. } => "store_key_mismatch",
            Self::NoRandomness => "no_randomness",
        }
    }

    /// The store is a service beside us, as an upstream is; a key file that differs
    /// from the other instances' is the configuration's.
    fn source(&self) -> Source {
        match self {
            Self::Connect(_) | Self::Command(_) => Source::Upstream,
            Self::DoesNotOpen { .. } => Source::Config,
            Self::NoRandomness => Source::Internal,
        }
    }

    /// The store's round trips are tried again (the next poll, the order's backoff).
    fn retryable(&self) -> bool {
        matches!(self, Self::Connect(_) | Self::Command(_))
    }
}

/// A field of the challenges' hash for an HTTP-01 token or a TLS-ALPN-01 name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Answer {
    Http01(String),
    TlsAlpn01(String),
}

impl Answer {
    fn field(&self) -> String {
        match self {
            Self::Http01(token) => format!("http-01 {token}"),
            Self::TlsAlpn01(name) => format!("tls-alpn-01 {}", name.to_ascii_lowercase()),
        }
    }

    fn parse(field: &str) -> Option<Self> {
        match field.split_once(' ')? {
            ("http-01", token) => Some(Self::Http01(token.to_owned())),
            ("tls-alpn-01", name) => Some(Self::TlsAlpn01(name.to_owned())),
            _ => None,
        }
    }

    /// Publishes the answer on this instance's listeners until the guard is dropped
    /// (`None`: `Theirs`, and an answer of ours is there).
    pub(crate) fn publish(
        &self,
        challenges: &Arc<Challenges>,
        key_authorization: &str,
        whose: Whose,
    ) -> Result<Option<Published>, ChallengeError> {
        match self {
            Self::Http01(token) => {
                Ok(challenges.publish_http01(token, key_authorization.to_owned(), whose))
            }
            Self::TlsAlpn01(name) => challenges.publish_tls_alpn01(name, key_authorization, whose),
        }
    }
}

/// A lock held on one of the store's names.
#[derive(Debug)]
pub(crate) struct Lock {
    name: String,
    token: String,
}

/// The fleet's store as ACME uses it, from the ACME thread only.
pub(crate) struct FleetStore {
    client: Client,
    kek: Kek,
    prefix: String,
    /// Who this instance is in lock and challenge entries.
    instance: String,
    /// How often other instances' challenge answers are read.
    pub(crate) look: Duration,
    conn: tokio::sync::Mutex<Option<MultiplexedConnection>>,
}

impl std::fmt::Debug for FleetStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetStore")
            .field("prefix", &self.prefix)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl FleetStore {
    /// The store `settings` name (its files read; no connection yet).
    pub(crate) fn open(settings: &StoreSettings) -> Result<Self, StoreError> {
        let (client, kek) = settings.open()?;
        Ok(Self {
            client,
            kek,
            prefix: settings.prefix.clone(),
            instance: terminus_fleet::instance_id(),
            look: settings.poll.min(LOOK_MAX),
            conn: tokio::sync::Mutex::new(None),
        })
    }

    /// A connection, made anew after any error on the last one.
    async fn conn(&self) -> Result<MultiplexedConnection, FleetStoreError> {
        let mut held = self.conn.lock().await;
        if let Some(conn) = held.as_ref() {
            return Ok(conn.clone());
        }
        let conn = terminus_fleet::store::connect(&self.client, terminus_fleet::store::TIMEOUT)
            .await
            .map_err(FleetStoreError::Connect)?;
        *held = Some(conn.clone());
        Ok(conn)
    }

    /// Runs `cmd`, forgetting the connection if it failed.
    async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<T, FleetStoreError> {
        let mut conn = self.conn().await?;
        match cmd.query_async(&mut conn).await {
            Ok(value) => Ok(value),
            Err(e) => {
                if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
                    *self.conn.lock().await = None;
                }
                Err(FleetStoreError::Command(e))
            }
        }
    }

    fn name(&self, what: &str) -> String {
        format!("{}acme:{what}", self.prefix)
    }

    /// The entry for `names`' certificate of `kind`.
    pub(crate) fn certificate(names: &[String], kind: CertKind) -> String {
        let first = names.first().map_or("default", String::as_str);
        format!("cert:{}:{}", first.to_ascii_lowercase(), kind.name())
    }

    /// The entry for the account at `directory`.
    pub(crate) fn account(directory: &str) -> String {
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, directory.as_bytes());
        format!("account:{}", hex(&digest.as_ref()[..8]))
    }

    /// The secret kept as `entry`, opened; `None` if there is none. One that does not
    /// open is an error naming the key file: instances of a fleet share it.
    pub(crate) async fn get(
        &self,
        entry: &str,
    ) -> Result<Option<Zeroizing<Vec<u8>>>, FleetStoreError> {
        let name = self.name(entry);
        let sealed: Option<Vec<u8>> = self.query(redis::cmd("GET").arg(&name)).await?;
        let Some(sealed) = sealed else {
            return Ok(None);
        };
        self.kek
            .open(name.as_bytes(), &sealed)
            .map(Some)
            .ok_or(FleetStoreError::DoesNotOpen { name })
    }

    /// Keeps `secret` as `entry`, sealed, until `expires` (or for good).
    pub(crate) async fn put(
        &self,
        entry: &str,
        secret: &[u8],
        expires: Option<SystemTime>,
    ) -> Result<(), FleetStoreError> {
        let name = self.name(entry);
        let sealed = self.kek.seal(name.as_bytes(), secret);
        let mut cmd = redis::cmd("SET");
        cmd.arg(&name).arg(sealed);
        if let Some(at) = expires {
            cmd.arg("EXAT").arg(unix(at).max(1));
        }
        self.query::<()>(&cmd).await
    }

    /// Takes the lock on `what` if no instance holds it.
    pub(crate) async fn lock(&self, what: &str) -> Result<Option<Lock>, FleetStoreError> {
        let name = self.name(&format!("lock:{what}"));
        let mut random = [0u8; 12];
        aws_lc_rs::rand::fill(&mut random).map_err(|_| FleetStoreError::NoRandomness)?;
        let token = format!("{} {}", self.instance, hex(&random));
        let taken: Option<String> = self
            .query(
                redis::cmd("SET")
                    .arg(&name)
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(LOCK_TTL.as_millis() as u64),
            )
            .await?;
        Ok(taken.map(|_| Lock { name, token }))
    }

    /// Keeps `lock` for `wait` from now (if it is still this instance's) and lets it
    /// lapse then: after a failed order, no instance orders the same names again before
    /// this one's backoff (and the CA's Retry-After) has passed.
    pub(crate) async fn hold(&self, lock: Lock, wait: Duration) {
        const HOLD: &str =
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end";
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(HOLD)
            .arg(1)
            .arg(&lock.name)
            .arg(&lock.token)
            .arg(wait.as_millis().max(1) as u64);
        if let Err(e) = self.query::<i64>(&cmd).await {
            tracing::debug!("acme: holding {} ({e})", lock.name);
        }
    }

    /// Releases `lock` if it is still this instance's.
    pub(crate) async fn unlock(&self, lock: Lock) {
        const RELEASE: &str =
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(RELEASE).arg(1).arg(&lock.name).arg(&lock.token);
        if let Err(e) = self.query::<i64>(&cmd).await {
            tracing::debug!(
                "acme: releasing {} ({e}); it lapses in {} s",
                lock.name,
                LOCK_TTL.as_secs()
            );
        }
    }

    /// Shares `answer` with every instance until [`FleetStore::withdraw`].
    pub(crate) async fn publish(
        &self,
        answer: &Answer,
        key_authorization: &str,
    ) -> Result<(), FleetStoreError> {
        let expiry = unix(SystemTime::now() + CHALLENGE_TTL);
        let value = format!("{expiry} {} {key_authorization}", self.instance);
        let hash = self.name("challenges");
        let field = answer.field();
        let sealed = self
            .kek
            .seal(label(&hash, &field).as_bytes(), value.as_bytes());
        self.query::<()>(redis::cmd("HSET").arg(&hash).arg(field).arg(sealed))
            .await
    }

    /// Withdraws `answers` from the other instances.
    pub(crate) async fn withdraw(&self, answers: &[Answer]) {
        if answers.is_empty() {
            return;
        }
        let mut cmd = redis::cmd("HDEL");
        cmd.arg(self.name("challenges"));
        for answer in answers {
            cmd.arg(answer.field());
        }
        if let Err(e) = self.query::<i64>(&cmd).await {
            tracing::debug!("acme: withdrawing challenge answers ({e}); they lapse on their own");
        }
    }

    /// The answers other instances publish now, by field; expired ones (and ones that
    /// do not open) removed, each only if it is still what was read.
    async fn others(&self) -> Result<HashMap<Answer, String>, FleetStoreError> {
        let hash = self.name("challenges");
        let all: HashMap<String, Vec<u8>> = self.query(redis::cmd("HGETALL").arg(&hash)).await?;
        let now = unix(SystemTime::now());
        let mut live = HashMap::new();
        let mut stale = Vec::new();
        for (field, sealed) in all {
            let opened = self.kek.open(label(&hash, &field).as_bytes(), &sealed);
            let value = opened.as_deref().and_then(|v| std::str::from_utf8(v).ok());
            let mut parts = value.unwrap_or("").splitn(3, ' ');
            let (Some(expiry), Some(instance), Some(key_authorization), Some(answer)) = (
                parts.next(),
                parts.next(),
                parts.next(),
                Answer::parse(&field),
            ) else {
                stale.push((field, sealed));
                continue;
            };
            if expiry.parse::<u64>().map_or(true, |e| e < now) {
                stale.push((field, sealed));
            } else if instance != self.instance {
                live.insert(answer, key_authorization.to_owned());
            }
        }
        tracing::trace!(
            "acme: {} answer(s) of other instances in the store, {} stale",
            live.len(),
            stale.len()
        );
        if !stale.is_empty() {
            const REMOVE: &str = "for i = 1, #ARGV, 2 do if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then redis.call('HDEL', KEYS[1], ARGV[i]) end end return 0";
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(REMOVE).arg(1).arg(&hash);
            for (field, sealed) in stale {
                cmd.arg(field).arg(sealed);
            }
            let _ = self.query::<i64>(&cmd).await;
        }
        Ok(live)
    }

    /// Answers, on this instance's listeners, the challenges other instances' orders
    /// published, read every `look`; forever.
    pub(crate) async fn mirror(self: Arc<Self>, challenges: Arc<Challenges>) {
        let mut answering: HashMap<Answer, (String, Published)> = HashMap::new();
        let mut failing = false;
        loop {
            match self.others().await {
                Ok(others) => {
                    failing = false;
                    answering.retain(|answer, (value, _)| others.get(answer) == Some(value));
                    for (answer, value) in others {
                        if answering.contains_key(&answer) {
                            continue;
                        }
                        match answer.publish(&challenges, &value, Whose::Theirs) {
                            Ok(None) => {}
                            Ok(Some(published)) => {
                                tracing::debug!(
                                    "acme: answering {} for another instance's order",
                                    answer.field()
                                );
                                answering.insert(answer, (value, published));
                            }
                            Err(e) => tracing::warn!(
                                "acme: another instance's challenge {}: {e}",
                                answer.field()
                            ),
                        }
                    }
                }
                Err(e) => {
                    if !failing {
                        terminus_error::log(
                            &e,
                            None,
                            "acme: other instances' challenge answers unread: ",
                        );
                    }
                    failing = true;
                }
            }
            tokio::time::sleep(self.look).await;
        }
    }
}

/// A challenge's additional data: the hash's name and the field.
fn label(hash: &str, field: &str) -> String {
    format!("{hash} {field}")
}

/// Unix seconds.
fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The store going away is an upstream's failure, logged at warn and tried again; a
    /// key file that differs from the other instances' is the configuration's.
    #[test]
    fn a_store_that_fails_is_an_upstream_and_a_key_file_that_differs_is_config() {
        let down = FleetStoreError::Connect(redis::RedisError::from((
            redis::ErrorKind::Io,
            "connection refused",
        )));
        assert_eq!(down.kind(), "store_unreachable");
        assert_eq!(down.source().level(), tracing::Level::WARN);
        assert!(down.retryable());
        let other_key = FleetStoreError::DoesNotOpen {
            name: "terminus:acme:account:00".into(),
        };
        assert_eq!(other_key.kind(), "store_key_mismatch");
        assert_eq!(other_key.source(), Source::Config);
        assert!(!other_key.retryable());
        assert!(other_key.to_string().starts_with(
            "terminus:acme:account:00 in the fleet's store does not open with [fleet] key_file"
        ));
    }

    #[test]
    fn an_answer_is_found_again_from_its_field() {
        for answer in [
            Answer::Http01("tok-EN_1".into()),
            Answer::TlsAlpn01("a.test".into()),
        ] {
            assert_eq!(Answer::parse(&answer.field()), Some(answer));
        }
        assert_eq!(Answer::parse("dns-01 a.test"), None);
        assert_eq!(
            Answer::TlsAlpn01("A.Test".into()).field(),
            "tls-alpn-01 a.test"
        );
    }
}
