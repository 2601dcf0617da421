//! How ticket keys are kept in the store: one entry per epoch, wrapped, named
//! `{prefix}ticket-key:{rotate seconds}:{epoch}` (the period is in the name, so instances
//! configured differently never mix their epochs), living until no instance may open
//! tickets with it; and a channel, `{prefix}ticket-keys`, on which the instance that made
//! an entry names its epoch.

use redis::aio::MultiplexedConnection;
use redis::RedisResult;

use crate::tickets::Rotation;

/// Names and lifetimes of a fleet's key entries.
#[derive(Debug, Clone)]
pub struct KeyEntries {
    prefix: String,
    rotation: Rotation,
}

impl KeyEntries {
    /// The entries of a fleet whose names begin with `prefix`, rotating as `rotation` says.
    pub fn new(prefix: &str, rotation: Rotation) -> Self {
        Self {
            prefix: prefix.to_owned(),
            rotation,
        }
    }

    /// The entry of `epoch`'s key.
    pub fn name(&self, epoch: u64) -> String {
        format!(
            "{}ticket-key:{}:{epoch}",
            self.prefix,
            self.rotation.period()
        )
    }

    /// The channel that announces new entries.
    pub fn channel(&self) -> String {
        format!("{}ticket-keys", self.prefix)
    }

    /// Seconds `epoch`'s entry must live from Unix time `unix`: until the end of the last
    /// epoch that may open its tickets, and one period more for clocks that lag.
    pub fn ttl(&self, epoch: u64, unix: u64) -> u64 {
        let p = self.rotation.period();
        let until = (epoch + u64::from(self.rotation.keep) + 1) * p;
        until.saturating_sub(unix).max(1)
    }

    /// The epochs whose keys an instance holds at `epoch`: `keep - 1` before it, it, and
    /// the next.
    pub fn held(&self, epoch: u64) -> std::ops::RangeInclusive<u64> {
        epoch.saturating_sub(u64::from(self.rotation.keep) - 1)..=epoch + 1
    }

    /// The entries of the epochs held at `epoch`, in one `MGET`: each epoch, its entry's
    /// name and what the store has under it.
    pub async fn fetch(
        &self,
        conn: &mut MultiplexedConnection,
        epoch: u64,
    ) -> RedisResult<Vec<(u64, String, Option<Vec<u8>>)>> {
        let epochs: Vec<u64> = self.held(epoch).collect();
        let names: Vec<String> = epochs.iter().map(|e| self.name(*e)).collect();
        let found: Vec<Option<Vec<u8>>> = redis::cmd("MGET").arg(&names).query_async(conn).await?;
        Ok(epochs
            .into_iter()
            .zip(names)
            .zip(found)
            .map(|((e, n), v)| (e, n, v))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn an_entry_lives_until_its_last_opening_epoch_ends_and_a_period_more() {
        let e = KeyEntries::new(
            "t:",
            Rotation {
                rotate: Duration::from_secs(10),
                keep: 2,
            },
        );
        assert_eq!(e.name(7), "t:ticket-key:10:7");
        // Epoch 7 is [70, 80); its tickets open through epoch 8, until 90; and 10 s more.
        assert_eq!(e.ttl(7, 75), 25);
        assert_eq!(e.ttl(8, 75), 35, "the next epoch's, made ahead");
        assert_eq!(e.held(7), 6..=8);
    }
}
