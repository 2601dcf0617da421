//! The ticket keys an instance holds, by epoch: at most one from the store and one of its
//! own per epoch (its own only where the store had none in time), none older than
//! `keep` periods.

use super::key::{KeyMaterial, TicketKey, NAME_LEN};
use super::Rotation;

/// Store keys kept per epoch: the newest seals, one before it still opens.
pub const STORE_KEYS_PER_EPOCH: usize = 2;

/// One key held.
struct Held {
    epoch: u64,
    /// It came from the store (every instance holds it), not made here.
    shared: bool,
    key: TicketKey,
    /// What it was made from, kept (zeroed when dropped) for a successor process to
    /// take over ([`Ring::materials`]).
    material: KeyMaterial,
}

/// The keys held, and which one seals and which may open at a given epoch.
pub struct Ring {
    rotation: Rotation,
    keys: Vec<Held>,
    /// Keys made here so far.
    made: u64,
    /// The newest epoch the ring was brought up to (the one sealing now), and how many
    /// times that moved on to a later one: rotations, for the metrics.
    epoch: Option<u64>,
    rotations: u64,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("rotation", &self.rotation)
            .field("keys", &self.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Ring {
    /// An empty ring rotating as `rotation` says.
    pub fn new(rotation: Rotation) -> Self {
        Self {
            rotation,
            keys: Vec::new(),
            made: 0,
            epoch: None,
            rotations: 0,
        }
    }

    /// How it rotates.
    pub fn rotation(&self) -> Rotation {
        self.rotation
    }

    /// The oldest epoch whose key still opens tickets at `epoch`.
    fn oldest(&self, epoch: u64) -> u64 {
        epoch.saturating_sub(u64::from(self.rotation.keep) - 1)
    }

    /// Brings the ring to `epoch`: keys older than `keep` periods before it are erased,
    /// zeroed by aws-lc as they are freed, and if nothing can seal at `epoch` a key is
    /// made here. An `epoch` before the newest one reached (a clock stepped back) erases no
    /// key of the epochs since, up to `keep` epochs ahead of it: other instances seal with
    /// them now, and this one seals with them again once its clock catches up. Keys further
    /// ahead are erased (and the ring is brought back to `keep` ahead): a clock that once
    /// jumped far forward leaves no key that would open tickets again once the clock gets
    /// there.
    /// Returns how many keys were made (0 or 1).
    pub fn advance(&mut self, epoch: u64) -> usize {
        let ahead = epoch.saturating_add(u64::from(self.rotation.keep));
        let newest = match self.epoch {
            Some(was) if was < epoch => {
                self.rotations += 1;
                epoch
            }
            Some(was) => was.min(ahead),
            None => epoch,
        };
        self.epoch = Some(newest);
        let oldest = self.oldest(epoch);
        self.keys
            .retain(|k| (oldest..=newest + 1).contains(&k.epoch));
        if self.keys.iter().any(|k| k.epoch == epoch) {
            return 0;
        }
        let material = KeyMaterial::generate();
        self.keys.push(Held {
            epoch,
            shared: false,
            key: material.key(),
            material,
        });
        self.made += 1;
        1
    }

    /// How many keys were made here, not taken from a store.
    pub fn made(&self) -> u64 {
        self.made
    }

    /// The epoch sealing now (the newest the ring was brought up to), once there is one.
    pub fn epoch(&self) -> Option<u64> {
        self.epoch
    }

    /// How many times the sealing epoch moved on.
    pub fn rotations(&self) -> u64 {
        self.rotations
    }

    /// Adds the store's key for `epoch`, seen at `now` (an epoch): true if it is new to
    /// the ring. A key for an epoch already past `keep`, or more than one ahead, is not
    /// taken; one replacing another store key for the same epoch (the store lost it and
    /// made another) keeps the previous one opening until it ages out, but no more than
    /// [`STORE_KEYS_PER_EPOCH`] are kept: a store that keeps losing its keys cannot make
    /// the ring grow.
    pub fn insert_shared(&mut self, epoch: u64, material: &KeyMaterial, now: u64) -> bool {
        if epoch < self.oldest(now) || epoch > now + 1 {
            return false;
        }
        let name = material.name();
        if self.keys.iter().any(|k| k.key.name() == &name) {
            return false;
        }
        // The newest store key seals: put it first among the epoch's keys.
        let at = self
            .keys
            .iter()
            .position(|k| k.epoch == epoch)
            .unwrap_or(self.keys.len());
        self.keys.insert(
            at,
            Held {
                epoch,
                shared: true,
                key: material.key(),
                material: material.clone(),
            },
        );
        let mut kept = 0;
        self.keys.retain(|k| {
            if k.epoch != epoch || !k.shared {
                return true;
            }
            kept += 1;
            kept <= STORE_KEYS_PER_EPOCH
        });
        true
    }

    /// Whether a store key other than `name` is held for `epoch`.
    pub fn replaced(&self, epoch: u64, name: &[u8; NAME_LEN]) -> bool {
        self.keys
            .iter()
            .any(|k| k.epoch == epoch && k.shared && k.key.name() != name)
    }

    /// The key that seals at `epoch`: the store's newest for it, else one made here.
    pub fn sealing(&self, epoch: u64) -> Option<&TicketKey> {
        let mine = self.keys.iter().filter(|k| k.epoch == epoch);
        let mut made_here = None;
        for k in mine {
            if k.shared {
                return Some(&k.key);
            }
            made_here.get_or_insert(&k.key);
        }
        made_here
    }

    /// The key `ticket` names and its epoch, if that key may open tickets at `epoch`:
    /// from `keep - 1` epochs before it to the next.
    pub fn opening(&self, ticket: &[u8], epoch: u64) -> Option<(u64, &TicketKey)> {
        let name = ticket.get(..NAME_LEN)?;
        let oldest = self.oldest(epoch);
        self.keys
            .iter()
            .find(|k| k.key.name()[..] == *name)
            .filter(|k| (oldest..=epoch + 1).contains(&k.epoch))
            .map(|k| (k.epoch, &k.key))
    }

    /// Every key held with what it was made from: for a process taking over from this
    /// one, so that the tickets this one issued open there.
    pub fn materials(&self) -> impl Iterator<Item = (u64, bool, &KeyMaterial)> + '_ {
        self.keys.iter().map(|k| (k.epoch, k.shared, &k.material))
    }

    /// Takes a key the process this one replaced held (`materials` there), as held
    /// there, if it is still within `keep` of `now` and not held already: true if it
    /// was taken. Such a key seals as it sealed there: the tickets both issue open in
    /// both.
    pub fn adopt(&mut self, epoch: u64, shared: bool, material: &KeyMaterial, now: u64) -> bool {
        if epoch < self.oldest(now) || epoch > now + u64::from(self.rotation.keep) {
            return false;
        }
        let name = material.name();
        if self.keys.iter().any(|k| k.key.name() == &name) {
            return false;
        }
        // A key of the epoch made here by this process beside it: the adopted one seals
        // (it is first among the epoch's keys) and the one made here still opens.
        let at = (self.keys.iter())
            .position(|k| k.epoch == epoch)
            .unwrap_or(self.keys.len());
        self.keys.insert(
            at,
            Held {
                epoch,
                shared,
                key: material.key(),
                material: material.clone(),
            },
        );
        true
    }

    /// Every key held: its epoch, whether it came from the store, and its name.
    pub fn keys(&self) -> impl Iterator<Item = (u64, bool, [u8; NAME_LEN])> + '_ {
        self.keys.iter().map(|k| (k.epoch, k.shared, *k.key.name()))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ring(keep: u32) -> Ring {
        Ring::new(Rotation {
            rotate: Duration::from_secs(10),
            keep,
        })
    }

    #[test]
    fn alone_a_ring_makes_a_key_per_epoch_and_opens_tickets_for_keep_epochs() {
        let mut r = ring(3);
        assert_eq!(r.advance(100), 1);
        assert_eq!(r.advance(100), 0);
        let ticket = r.sealing(100).unwrap().seal(b"s").unwrap();
        for (epoch, opens) in [(100, true), (101, true), (102, true), (103, false)] {
            r.advance(epoch);
            assert_eq!(
                r.opening(&ticket, epoch).is_some(),
                opens,
                "sealed at 100, opened at {epoch}"
            );
        }
        // Past keep the key is gone from memory, not only refused.
        assert!(r.keys().all(|(e, _, _)| e >= 101));
        assert_eq!((r.epoch(), r.rotations()), (Some(103), 3));
        // A clock gone back is no rotation.
        r.advance(102);
        assert_eq!((r.epoch(), r.rotations()), (Some(103), 3));
    }

    #[test]
    fn a_clock_stepped_back_erases_no_newer_key_and_they_open_tickets_again() {
        let mut r = ring(2);
        // At 101 the ring holds 101's key (sealing) and the next epoch's, from the store.
        r.advance(101);
        let next = KeyMaterial::generate();
        assert!(r.insert_shared(102, &next, 101));
        let sealed_at_101 = r.sealing(101).unwrap().seal(b"s").unwrap();
        // Another instance whose clock is a period ahead seals with the next key.
        let sealed_ahead = next.key().seal(b"s").unwrap();
        // One epoch back, then two: every key held at 101 survives, and opens again (or
        // seals again) once the clock is back.
        for back in [100, 99] {
            r.advance(back);
            assert_eq!(
                r.opening(&sealed_at_101, back).is_some(),
                back == 100,
                "101's key opens at {back} as the next epoch's, only one back"
            );
            r.advance(101);
            assert!(
                r.opening(&sealed_at_101, 101).is_some(),
                "101's key, back at 101 from {back}"
            );
            assert!(
                r.opening(&sealed_ahead, 101).is_some(),
                "102's key, back at 101 from {back}"
            );
            assert_eq!(r.sealing(101).unwrap().name(), sealing_name(&sealed_at_101));
        }
    }

    #[test]
    fn a_clock_once_far_ahead_leaves_no_key_that_opens_tickets_when_it_gets_there() {
        let mut r = ring(2);
        r.advance(100);
        // The clock jumps a thousand periods ahead: a key made there seals a ticket.
        r.advance(1100);
        let sealed_far_ahead = r.sealing(1100).unwrap().seal(b"s").unwrap();
        // Back to the right time: only keys up to keep + 1 epochs ahead are kept.
        r.advance(100);
        assert!(
            r.keys().all(|(e, _, _)| e <= 100 + 2 + 1),
            "{:?}",
            r.keys().collect::<Vec<_>>()
        );
        assert_eq!(r.epoch(), Some(102));
        // When the clock gets there for real, that ticket opens nowhere.
        r.advance(1100);
        assert!(r.opening(&sealed_far_ahead, 1100).is_none());
        assert_ne!(
            r.sealing(1100).unwrap().name(),
            sealing_name(&sealed_far_ahead)
        );
    }

    fn sealing_name(ticket: &[u8]) -> &[u8; NAME_LEN] {
        ticket[..NAME_LEN].try_into().unwrap()
    }

    #[test]
    fn the_stores_key_seals_once_it_comes_and_a_key_made_meanwhile_still_opens() {
        let mut r = ring(2);
        r.advance(100);
        let local = r.sealing(100).unwrap().seal(b"s").unwrap();
        let shared = KeyMaterial::generate();
        assert!(r.insert_shared(100, &shared, 100));
        assert!(!r.insert_shared(100, &shared, 100), "once");
        assert_eq!(r.sealing(100).unwrap().name(), &shared.name());
        assert!(r.opening(&local, 100).is_some());
        // The next epoch's key from the store: opens now, seals when its epoch comes,
        // and no key is made here for it.
        let next = KeyMaterial::generate();
        assert!(r.insert_shared(101, &next, 100));
        let early = next.key().seal(b"s").unwrap();
        assert!(r.opening(&early, 100).is_some(), "a clock running ahead");
        assert_eq!(r.advance(101), 0);
        assert_eq!(r.sealing(101).unwrap().name(), &next.name());
        // A store that loses its key again and again: two kept for the epoch.
        for _ in 0..5 {
            assert!(r.insert_shared(101, &KeyMaterial::generate(), 101));
        }
        assert_eq!(r.keys().filter(|(e, s, _)| *e == 101 && *s).count(), 2);
        // Too old or too far ahead: not taken.
        assert!(!r.insert_shared(98, &KeyMaterial::generate(), 101));
        assert!(!r.insert_shared(103, &KeyMaterial::generate(), 101));
    }
}
