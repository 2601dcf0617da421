//! Which worker owns a QUIC connection, and datagrams handed to it.
//!
//! Every worker has its own UDP socket on the listener's port (`SO_REUSEPORT`), and the
//! kernel picks the socket by hashing the datagram's addresses. A client that changes
//! address (NAT rebinding, migration to another network) may therefore reach another
//! worker, which does not know the connection: the datagram would be lost (or answered
//! with a stateless reset, which, under that worker's own reset key, the client would
//! ignore). So the connection IDs terminus issues name their worker, and a worker hands
//! a datagram whose destination ID names another worker to that worker, whose endpoint
//! handles it as if its own socket had read it (it answers from its own socket: same
//! address and port).
//!
//! Only datagrams of established paths are handed over: short-header packets and
//! Handshake packets. Initial and 0-RTT packets carry the ID the client chose, and a
//! client cannot change address before its handshake is done, so they stay where the
//! kernel put them (else IDs of a past connection, as a new one's first DCID, would let
//! anyone steer handshakes onto one worker).
//!
//! A connection ID is `CID_LEN` bytes: the worker's index and a check value, both
//! masked with a keyed hash (SipHash, one random key per listener) of the 8 random bytes
//! that follow. To anyone without the key the ID is random, so an observer cannot link
//! two IDs of one connection by their worker (RFC 9000 section 5.1); to the workers it
//! names its owner, and the check rejects most IDs that terminus did not issue. Client
//! chosen IDs (a first Initial's) are random too: the few that pass the check are
//! handed to the same worker every time, which then serves that connection.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use quinn_proto::{ConnectionId, ConnectionIdGenerator, EcnCodepoint, InvalidCid};
use tokio::sync::mpsc;

use crate::succession::{Passed, Predecessor};

/// Length of the connection IDs terminus issues.
pub const CID_LEN: usize = 12;
/// Where the random part of an ID starts (the masked worker index and check before it).
const RANDOM_AT: usize = 4;

/// Datagrams waiting to be handled by a worker at most: beyond, they are dropped, as a
/// full socket buffer would drop them.
const HANDOVER_QUEUE: usize = 1024;
/// The largest datagram handed over (an Ethernet frame's payload; QUIC's are at most
/// 1,452 bytes unless a path is found to take more): bounds what a queue holds, 1.5 MB.
const MAX_HANDED: usize = 1500;

/// A datagram read by one worker, for the endpoint of the worker that owns its
/// connection (this one's, or another's).
pub(crate) struct Handover {
    pub(crate) remote: SocketAddr,
    /// The address it was sent to, where the socket says.
    pub(crate) local_ip: Option<IpAddr>,
    pub(crate) ecn: Option<EcnCodepoint>,
    pub(crate) data: BytesMut,
}

/// The key that masks connection IDs, shared by one listener's workers.
#[derive(Clone)]
struct Mask(RandomState);

impl Mask {
    /// The mask of an ID's first `RANDOM_AT` bytes for its random part: two bytes over
    /// the worker's index, two bytes of check.
    fn of(&self, random: &[u8]) -> [u8; RANDOM_AT] {
        let h = self.0.hash_one(random).to_le_bytes();
        [h[0], h[1], h[2], h[3]]
    }

    /// The worker `cid` names, if it is one of ours (its check holds).
    fn owner(&self, cid: &[u8]) -> Option<u16> {
        if cid.len() != CID_LEN {
            return None;
        }
        let mask = self.of(&cid[RANDOM_AT..]);
        (cid[2] ^ mask[2] == 0 && cid[3] ^ mask[3] == 0)
            .then(|| u16::from_be_bytes([cid[0] ^ mask[0], cid[1] ^ mask[1]]))
    }
}

/// One worker's place among a listener's workers: its index, the IDs it issues, and
/// the queues to hand datagrams to the others and to receive theirs.
pub struct Member {
    index: u16,
    mask: Mask,
    peers: Arc<[mpsc::Sender<Handover>]>,
    pub(crate) inbox: mpsc::Receiver<Handover>,
    /// The process this one replaced, while it drains: what is not ours may be its.
    predecessor: Option<Arc<Predecessor>>,
}

/// The members of a listener whose QUIC is served by `workers` workers, in worker
/// order (at most 65,536 workers).
pub fn members(workers: usize) -> Vec<Member> {
    assert!(
        workers <= usize::from(u16::MAX) + 1,
        "at most 65,536 workers"
    );
    let mask = Mask(RandomState::new());
    let (senders, inboxes): (Vec<_>, Vec<_>) =
        (0..workers).map(|_| mpsc::channel(HANDOVER_QUEUE)).unzip();
    let peers: Arc<[_]> = senders.into();
    inboxes
        .into_iter()
        .enumerate()
        .map(|(index, inbox)| Member {
            index: index as u16,
            mask: mask.clone(),
            peers: peers.clone(),
            inbox,
            predecessor: None,
        })
        .collect()
}

/// What to do with a datagram a worker's socket read.
pub(crate) enum Owner {
    /// This worker handles it: its connection's, a new connection's, or nobody's.
    Here(Handover),
    /// Handed to the worker that owns its connection.
    Handed,
    /// Another worker's, which could not take it (gone, or its queue full): dropped.
    Dropped,
    /// Passed to the process this one replaced (not an ID of ours, while it drains).
    Passed,
}

impl Member {
    /// What makes this worker's generators (quinn-proto's endpoint configuration).
    pub(crate) fn cid_generators(&self) -> impl Fn() -> Box<dyn ConnectionIdGenerator> {
        let issuer = self.issuer();
        move || Box::new(issuer.clone())
    }

    fn issuer(&self) -> Issuer {
        Issuer {
            index: self.index,
            mask: self.mask.clone(),
        }
    }

    /// The process this one replaced drains its QUIC connections: datagrams of
    /// established paths whose IDs are not ours are passed to it.
    pub fn succeed(&mut self, predecessor: Option<Arc<Predecessor>>) {
        self.predecessor = predecessor;
    }

    /// Hands `data` to the worker that owns its connection if that is not this one (or
    /// to the process this one replaced, if it is not ours and that one drains).
    pub(crate) fn route(&self, datagram: Handover) -> Owner {
        let cid = destination(&datagram.data);
        let Some(owner) = cid.and_then(|cid| self.mask.owner(cid)) else {
            return match (cid, &self.predecessor) {
                (Some(cid), Some(predecessor)) => {
                    let cid: [u8; CID_LEN] = cid.try_into().unwrap_or_default();
                    match predecessor.pass(&cid, datagram) {
                        Passed::Taken => Owner::Passed,
                        Passed::Dropped => Owner::Dropped,
                        Passed::Gone(datagram) => Owner::Here(datagram),
                    }
                }
                _ => Owner::Here(datagram),
            };
        };
        let owner = usize::from(owner);
        if owner == usize::from(self.index) {
            return Owner::Here(datagram);
        }
        // An index past the workers: not an ID any worker issued (a forged check).
        let Some(peer) = self.peers.get(owner) else {
            return Owner::Here(datagram);
        };
        if datagram.data.len() > MAX_HANDED {
            return Owner::Dropped;
        }
        match peer.try_send(datagram) {
            Ok(()) => Owner::Handed,
            Err(_) => Owner::Dropped,
        }
    }
}

/// The destination connection ID of a short-header or Handshake packet, if it has one
/// of terminus's length: a long header states its length, a short header's is the
/// length this endpoint issues (RFC 9000 section 17, RFC 9369 for version 2's types;
/// RFC 8999 for the invariant layout).
fn destination(datagram: &[u8]) -> Option<&[u8]> {
    let first = *datagram.first()?;
    if first & 0x80 == 0 {
        return datagram.get(1..1 + CID_LEN);
    }
    let version = u32::from_be_bytes(datagram.get(1..5)?.try_into().ok()?);
    let handshake = if version == QUIC_V2 { 3 } else { 2 };
    if (first >> 4) & 0x03 != handshake {
        return None;
    }
    let len = usize::from(*datagram.get(5)?);
    (len == CID_LEN).then(|| datagram.get(6..6 + CID_LEN))?
}

/// QUIC version 2 (RFC 9369), whose long-header packet types are numbered apart.
const QUIC_V2: u32 = 0x6b33_43cf;

/// Issues a worker's connection IDs (quinn-proto's generator).
#[derive(Clone)]
struct Issuer {
    index: u16,
    mask: Mask,
}

impl ConnectionIdGenerator for Issuer {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut cid = [0u8; CID_LEN];
        fill_random(&mut cid[RANDOM_AT..]);
        let mask = self.mask.of(&cid[RANDOM_AT..]);
        let index = self.index.to_be_bytes();
        cid[0] = index[0] ^ mask[0];
        cid[1] = index[1] ^ mask[1];
        cid[2] = mask[2];
        cid[3] = mask[3];
        ConnectionId::new(&cid)
    }

    /// An ID another worker issued (or nobody did) is not this endpoint's: quinn-proto
    /// then sends no stateless reset for it, which would kill another worker's
    /// connection.
    fn validate(&self, cid: &ConnectionId) -> Result<(), InvalidCid> {
        match self.mask.owner(cid) {
            Some(owner) if owner == self.index => Ok(()),
            _ => Err(InvalidCid),
        }
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// Fills `out` from the system's CSPRNG (connection IDs must not be predictable, RFC
/// 9000 section 5.1, or an off-path attacker could inject packets for them).
fn fill_random(out: &mut [u8]) {
    aws_lc_rs::rand::fill(out).expect("the system's random source failed");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn short_packet(cid: &[u8]) -> Vec<u8> {
        let mut p = vec![0x40];
        p.extend_from_slice(cid);
        p.extend_from_slice(&[0xAA; 30]);
        p
    }

    fn long_packet(first: u8, cid: &[u8]) -> Vec<u8> {
        let mut p = vec![first, 0, 0, 0, 1, cid.len() as u8];
        p.extend_from_slice(cid);
        p.extend_from_slice(&[8, 1, 2, 3, 4, 5, 6, 7, 8, 0xBB, 0xBB]);
        p
    }

    #[test]
    fn each_worker_s_ids_name_it_and_only_it_validates_them() {
        let members = members(3);
        for (index, member) in members.iter().enumerate() {
            let mut issuer = member.cid_generators()();
            for _ in 0..1000 {
                let cid = issuer.generate_cid();
                assert_eq!(cid.len(), CID_LEN);
                assert_eq!(member.mask.owner(&cid), Some(index as u16));
                assert!(issuer.validate(&cid).is_ok());
                for (other, m) in members.iter().enumerate() {
                    if other != index {
                        assert!(m.cid_generators()().validate(&cid).is_err());
                    }
                }
            }
        }
    }

    #[test]
    fn ids_do_not_show_their_worker_in_the_clear() {
        // Across many IDs of one worker every byte takes many values: no byte is the
        // index unmasked (an observer could link a connection's IDs by it).
        let members = members(2);
        let mut issuer = members[1].cid_generators()();
        let ids: Vec<ConnectionId> = (0..512).map(|_| issuer.generate_cid()).collect();
        for byte in 0..CID_LEN {
            let distinct: std::collections::HashSet<u8> = ids.iter().map(|c| c[byte]).collect();
            assert!(
                distinct.len() > 100,
                "byte {byte} takes {} values",
                distinct.len()
            );
        }
    }

    #[test]
    fn random_ids_mostly_fail_the_check() {
        let members = members(2);
        let mut passed = 0;
        for _ in 0..100_000 {
            let mut cid = [0u8; CID_LEN];
            fill_random(&mut cid);
            passed += usize::from(members[0].mask.owner(&cid).is_some());
        }
        // 16 bits of check: about 1.5 in 100,000.
        assert!(passed < 20, "{passed} random IDs passed the check");
    }

    /// `bytes` as read from `remote`.
    fn read(remote: SocketAddr, bytes: &[u8]) -> Handover {
        Handover {
            remote,
            local_ip: None,
            ecn: None,
            data: BytesMut::from(bytes),
        }
    }

    #[test]
    fn a_datagram_for_another_worker_s_connection_is_handed_to_it() {
        let mut members = members(2);
        let theirs = members[1].cid_generators()().generate_cid();
        let ours = members[0].cid_generators()().generate_cid();
        let remote: SocketAddr = "127.0.0.1:4433".parse().unwrap();
        let route = |members: &[Member], packet: &[u8]| members[0].route(read(remote, packet));
        let handshake_packet = |cid: &[u8]| long_packet(0xE0, cid);
        for packet in [short_packet(&theirs), handshake_packet(&theirs)] {
            assert!(matches!(route(&members, &packet), Owner::Handed));
            let got = members[1].inbox.try_recv().unwrap();
            assert_eq!((got.remote, &got.data[..]), (remote, &packet[..]));
        }
        for packet in [short_packet(&ours), handshake_packet(&ours)] {
            assert!(matches!(route(&members, &packet), Owner::Here(_)));
        }
        // Initial and 0-RTT packets stay where the kernel put them, whatever their ID.
        for first in [0xC0, 0xD0] {
            let packet = long_packet(first, &theirs);
            assert!(matches!(route(&members, &packet), Owner::Here(_)));
        }
        // A long header with an ID of another length and a datagram too short to hold
        // an ID stay here.
        let other_length = handshake_packet(&theirs[..8]);
        assert!(matches!(route(&members, &other_length), Owner::Here(_)));
        assert!(matches!(route(&members, &[0x40, 1, 2]), Owner::Here(_)));
        // A datagram too large to queue is not handed over.
        let mut large = short_packet(&theirs);
        large.resize(MAX_HANDED + 1, 0);
        assert!(matches!(route(&members, &large), Owner::Dropped));
        // A worker gone: its datagrams are dropped, not answered here.
        drop(members.pop());
        let packet = short_packet(&theirs);
        assert!(matches!(route(&members, &packet), Owner::Dropped));
    }
}
