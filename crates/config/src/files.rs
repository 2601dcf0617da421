//! The `[files]` section: the static-file cache's settings, read as written (every key
//! has a default; a wrong type is a TOML error at its line).

use std::time::Duration;

use serde::Deserialize;

use crate::ConfigDuration;

/// The `[files]` section.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheSettings {
    /// `files.cache`: off opens and stats every file on every request.
    pub cache: bool,
    /// `files.cache_entries`: per worker.
    pub cache_entries: usize,
    /// `files.cache_valid`: how long an entry is served before it is looked up again.
    pub cache_valid: ConfigDuration,
    /// `files.cache_inactive`: entries unused this long are dropped.
    pub cache_inactive: ConfigDuration,
    /// `files.cache_max_size`: files up to this many bytes are kept in memory.
    pub cache_max_size: u64,
}

impl Default for CacheSettings {
    fn default() -> Self {
        Self {
            cache: true,
            cache_entries: 1024,
            cache_valid: ConfigDuration(Duration::from_secs(1)),
            cache_inactive: ConfigDuration(Duration::from_secs(60)),
            cache_max_size: 16 * 1024,
        }
    }
}
