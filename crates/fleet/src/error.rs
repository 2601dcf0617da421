//! Why a fleet's store cannot be used: its settings (`[fleet]`'s files and URL, checked
//! when the instance starts and by `terminus check`) or the store itself (`terminus
//! check`'s look at it).

use std::path::PathBuf;

/// Why `[fleet]`'s store cannot be used as configured, or (`terminus check`) does not
/// answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL is not a Redis one.
    #[error("store is a redis:// or rediss:// URL, not {}", if scheme.is_empty() { "this" } else { scheme })]
    Scheme {
        /// The URL's scheme, empty where it has none.
        scheme: String,
    },
    /// A file the settings name cannot be read.
    #[error("{what} {}: {source}", path.display())]
    Read {
        /// The setting naming it: `key_file`, `password_file`, `ca`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What reading it said.
        #[source]
        source: std::io::Error,
    },
    /// The key file does not hold a key.
    #[error("key_file {}: {source}", path.display())]
    KeyFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with what it holds.
        #[source]
        source: KeyFileError,
    },
    /// The password file is not text.
    #[error("password_file {}: not UTF-8", path.display())]
    PasswordNotText {
        /// The file.
        path: PathBuf,
    },
    /// The URL (or the client made with it) is refused by the Redis client.
    #[error("store {shown:?}: {source}")]
    Url {
        /// The URL, its password hidden.
        shown: String,
        /// What the client said.
        #[source]
        source: redis::RedisError,
    },
    /// `ca` with a plain `redis://` store.
    #[error("ca is for a rediss:// store")]
    CaWithoutTls,
    /// The runtime the store's rounds run on could not be made.
    #[error("the fleet's runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// (`terminus check`) The store does not answer.
    #[error("store {shown}: {source}")]
    Unreachable {
        /// The URL, its password hidden.
        shown: String,
        /// What the connection or the command said.
        #[source]
        source: redis::RedisError,
    },
    /// (`terminus check`) A ticket key in the store does not open with the key file.
    #[error("store {shown}: ticket key {name} does not open with key_file {}: every instance of a fleet needs the same key_file", key_file.display())]
    KeyDoesNotOpen {
        /// The URL, its password hidden.
        shown: String,
        /// The key's entry in the store.
        name: String,
        /// The key file.
        key_file: PathBuf,
    },
}

/// Why a key file's text is not a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyFileError {
    /// It is not UTF-8.
    #[error("not text")]
    NotText,
    /// It is not 64 hexadecimal digits.
    #[error("a key file holds 64 hexadecimal digits (32 bytes; make one with `openssl rand -hex 32`), not {len} characters")]
    NotHex {
        /// Its length, blank space around it left out.
        len: usize,
    },
}
