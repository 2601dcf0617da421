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

use redis::{Client, IntoConnectionInfo, TlsCertificates};

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

    /// The URL with any password in it hidden, for logs.
    pub fn shown(&self) -> String {
        match self.url.split_once('@') {
            Some((head, host)) => match head.rsplit_once(':') {
                Some((user, _)) if user.contains("//") && !user.ends_with('/') => {
                    format!("{user}:***@{host}")
                }
                _ => self.url.clone(),
            },
            None => self.url.clone(),
        }
    }

    /// The client and key-encryption key these settings name: the files read, the URL
    /// parsed; no connection yet.
    pub fn open(&self) -> Result<(Client, Kek), String> {
        let scheme = self.url.split("://").next().unwrap_or("");
        if !matches!(scheme, "redis" | "rediss") {
            return Err(format!(
                "store {:?} is not a redis:// or rediss:// URL",
                self.shown()
            ));
        }
        let read = |path: &PathBuf, what: &str| {
            std::fs::read(path).map_err(|e| format!("{what} {}: {e}", path.display()))
        };
        let kek_text = read(&self.key_file, "key_file")?;
        let kek = Kek::from_hex(&String::from_utf8_lossy(&kek_text))
            .map_err(|e| format!("key_file {}: {e}", self.key_file.display()))?;
        let mut info = self
            .url
            .as_str()
            .into_connection_info()
            .map_err(|e| format!("store {:?}: {e}", self.shown()))?;
        if let Some(path) = &self.password_file {
            let password = String::from_utf8(read(path, "password_file")?)
                .map_err(|_| format!("password_file {}: not UTF-8", path.display()))?;
            let settings = info
                .redis_settings()
                .clone()
                .set_password(password.trim_end_matches(['\r', '\n']));
            info = info.set_redis_settings(settings);
        }
        let client = match (&self.ca, scheme) {
            (Some(ca), "rediss") => Client::build_with_tls(
                info,
                TlsCertificates {
                    client_tls: None,
                    root_cert: Some(read(ca, "ca")?),
                },
            ),
            (Some(_), _) => return Err("ca is for a rediss:// store".into()),
            (None, _) => Client::open(info),
        }
        .map_err(|e| format!("store {:?}: {e}", self.shown()))?;
        Ok((client, kek))
    }
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
        assert_eq!(s("redis://10.0.0.1:6379").shown(), "redis://10.0.0.1:6379");
        assert!(s("http://x").open().unwrap_err().contains("redis://"));
    }
}
