//! The fleet's store: a Redis server (or Valkey, which speaks the same protocol), reached
//! from one thread of its own, never from the handshake path.
//!
//! - [`StoreSettings`]: where it is and how to log in (`[fleet]`), checked before start;
//! - [`keys`]: the ticket keys' entries, their names and lifetimes in the store;
//! - [`sync`]: the loop that keeps an instance's key ring in step with the store.

pub mod keys;
pub mod sync;

use std::path::PathBuf;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, IntoConnectionInfo, RedisResult, TlsCertificates};
use zeroize::Zeroizing;

use crate::error::{KeyFileError, StoreError};
use crate::tickets::key::Kek;

/// `[fleet]`: the store and the key that wraps what is kept there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSettings {
    /// `redis://host:port/db` or `rediss://` (TLS); an ACL user may be given in it.
    pub url: String,
    /// The key-encryption key (64 hex digits), the same file on every instance.
    pub key_file: PathBuf,
    /// The ACL password, read from this file (not written in the config).
    pub password_file: Option<PathBuf>,
    /// The CA that signed a `rediss://` server's certificate, where the system's roots
    /// do not.
    pub ca: Option<PathBuf>,
    /// Put before every key and channel name, so that several fleets share one Redis.
    pub prefix: String,
    /// How often the store is read even without news on its channel.
    pub poll: Duration,
}

impl StoreSettings {
    /// The default `prefix`.
    pub const PREFIX: &'static str = "terminus:";
    /// The default `poll`.
    pub const POLL: Duration = Duration::from_secs(1);

    /// The URL with any password in it hidden, for logs: the user, if any, and `***`
    /// in place of whatever follows the user's colon.
    pub fn shown(&self) -> String {
        let Some((scheme, rest)) = self.url.split_once("://") else {
            return "<not a URL>".into();
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        match authority.rsplit_once('@') {
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:***@{host}{path}"),
                None => format!("{scheme}://{userinfo}@{host}{path}"),
            },
            None => self.url.clone(),
        }
    }

    /// Why `url` cannot name a store, if it cannot (its password not shown).
    pub fn check_url(url: &str) -> Result<(), StoreError> {
        if url.starts_with("redis://") || url.starts_with("rediss://") {
            return Ok(());
        }
        let scheme = url.split_once("://").map_or("", |(s, _)| s);
        Err(StoreError::Scheme {
            scheme: scheme.to_owned(),
        })
    }

    /// The client and key-encryption key these settings name: the files read, the URL
    /// parsed; no connection yet.
    pub fn open(&self) -> Result<(Client, Kek), StoreError> {
        Self::check_url(&self.url)?;
        let tls = self.url.starts_with("rediss://");
        let read = |path: &PathBuf, what: &'static str| {
            std::fs::read(path)
                .map(Zeroizing::new)
                .map_err(|source| StoreError::Read {
                    what,
                    path: path.clone(),
                    source,
                })
        };
        let kek_text = read(&self.key_file, "key_file")?;
        let kek = std::str::from_utf8(&kek_text)
            .map_err(|_| KeyFileError::NotText)
            .and_then(Kek::from_hex)
            .map_err(|source| StoreError::KeyFile {
                path: self.key_file.clone(),
                source,
            })?;
        let refused = |source| StoreError::Url {
            shown: self.shown(),
            source,
        };
        let mut info = self.url.as_str().into_connection_info().map_err(refused)?;
        if let Some(path) = &self.password_file {
            let bytes = read(path, "password_file")?;
            let password = std::str::from_utf8(&bytes)
                .map_err(|_| StoreError::PasswordNotText { path: path.clone() })?;
            let settings = info
                .redis_settings()
                .clone()
                .set_password(password.trim_end_matches(['\r', '\n']));
            info = info.set_redis_settings(settings);
        }
        let client = match (&self.ca, tls) {
            (Some(ca), true) => Client::build_with_tls(
                info,
                TlsCertificates {
                    client_tls: None,
                    root_cert: Some(read(ca, "ca")?.to_vec()),
                },
            ),
            (Some(_), false) => return Err(StoreError::CaWithoutTls),
            (None, _) => Client::open(info),
        }
        .map_err(refused)?;
        Ok((client, kek))
    }
}

/// The key and share rounds' bound on opening a connection to the store and on each
/// command: a store on the LAN answers in well under a millisecond, a second without an
/// answer is a store that is down, and the rounds must fall back on the keys they hold by
/// then.
pub const ROUND_TIMEOUT: Duration = Duration::from_secs(1);

/// The bound of the store's other users (the ACME manager, `terminus check`), which
/// nothing waits on: a store further away is still reached.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// A connection to the store (`client` from [`StoreSettings::open`]), opened and answering
/// within `timeout` ([`ROUND_TIMEOUT`] or [`TIMEOUT`]): how every user of the store
/// connects.
pub async fn connect(client: &Client, timeout: Duration) -> RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_in_the_url_is_never_shown() {
        let s = |url: &str| StoreSettings {
            url: url.into(),
            key_file: "k".into(),
            password_file: None,
            ca: None,
            prefix: StoreSettings::PREFIX.into(),
            poll: StoreSettings::POLL,
        };
        assert_eq!(
            s("redis://app:hunter2@10.0.0.1:6379/0").shown(),
            "redis://app:***@10.0.0.1:6379/0"
        );
        assert_eq!(
            s("redis://:hunter2@10.0.0.1:6379/0").shown(),
            "redis://:***@10.0.0.1:6379/0"
        );
        assert_eq!(
            s("rediss://app:pa:ss@w@10.0.0.1").shown(),
            "rediss://app:***@10.0.0.1"
        );
        assert_eq!(s("redis://app@10.0.0.1").shown(), "redis://app@10.0.0.1");
        assert_eq!(s("redis://10.0.0.1:6379").shown(), "redis://10.0.0.1:6379");
        for url in [
            "redis://:hunter2@h/0",
            "redis://u:hunter2@h",
            "rediss://u:x:hunter2@h:1/2",
        ] {
            assert!(!s(url).shown().contains("hunter2"), "{url}");
        }
        let refused = s("http://x").open().unwrap_err();
        assert!(matches!(refused, StoreError::Scheme { .. }), "{refused:?}");
        assert_eq!(
            refused.to_string(),
            "store is a redis:// or rediss:// URL, not http"
        );
        assert_eq!(
            StoreSettings::check_url("localhost:6379")
                .unwrap_err()
                .to_string(),
            "store is a redis:// or rediss:// URL, not this"
        );
    }
}
