//! QUIC across a handover (`terminus upgrade`): the connections of the process that
//! handed over keep being served by it until they end, though the successor now reads
//! every UDP socket.
//!
//! TCP needs nothing of the kind: a connection accepted is the old process's own
//! socket. A QUIC connection is only datagrams on the listener's socket, which the
//! successor reads once it serves. So the successor hands the old process what is not
//! its own: a short-header or Handshake datagram whose destination connection ID is not
//! one of its workers' (the ID's check fails under its key; see [`crate::routing`]) goes
//! over a Unix datagram socket to the old process, which handles it as if its own
//! socket had read it, and answers from its own copy of the same UDP socket (same
//! address and port). New connections' Initial packets are never passed back: the old
//! process takes no connection after it has handed over. This is Envoy's hot-restart
//! answer (its child forwards the parent's QUIC packets), where tableflip and nginx
//! leave QUIC connections to die with the old process.
//!
//! The old process makes one Unix datagram socket pair per endpoint at start; it reads
//! one end, and hands the other to a successor with the listening sockets. Each
//! datagram passed carries its addressing in a fixed header ([`encode`]).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::BytesMut;
use quinn_proto::EcnCodepoint;
use tokio::sync::watch;

use crate::routing::Handover;

/// What one endpoint has of a handover: the datagrams its successor passes back once it
/// has handed over, and where it passes those of its predecessor's connections.
pub struct Succession {
    /// This endpoint's end of its pair, read once `handed_over` turns true.
    pub inbox: Option<UnixDatagram>,
    /// Turns true when this process has handed over: its UDP socket is the successor's
    /// to read from then on (it still sends on it).
    pub handed_over: watch::Receiver<bool>,
    /// The predecessor's endpoints of this listener, while it drains.
    pub predecessor: Option<Arc<Predecessor>>,
}

impl Succession {
    /// No handover: nothing passed either way.
    pub fn none() -> Self {
        Self {
            inbox: None,
            handed_over: watch::channel(false).1,
            predecessor: None,
        }
    }
}

/// The process this one replaced, while it drains: its endpoints' inboxes for one
/// listener.
pub struct Predecessor {
    /// Each endpoint's inbox, and whether it has closed: its worker has drained and
    /// stopped (the others may still serve), or the process has exited.
    inboxes: Vec<(UnixDatagram, AtomicBool)>,
}

/// What became of a datagram passed to the predecessor.
pub(crate) enum Passed {
    Taken,
    /// Its inbox is full: dropped, as a full socket buffer would drop it.
    Dropped,
    /// It has exited: the datagram is this process's to handle (nobody's).
    Gone(Handover),
}

impl Predecessor {
    /// The predecessor's inboxes (at least one), non-blocking.
    pub fn new(inboxes: Vec<UnixDatagram>) -> io::Result<Option<Arc<Self>>> {
        for inbox in &inboxes {
            inbox.set_nonblocking(true)?;
        }
        Ok((!inboxes.is_empty()).then(|| {
            let inboxes = (inboxes.into_iter())
                .map(|inbox| (inbox, AtomicBool::new(false)))
                .collect();
            Arc::new(Self { inboxes })
        }))
    }

    /// Passes `datagram`, whose destination ID is `cid`, to one of the predecessor's
    /// endpoints still open (chosen by the ID, so that one connection's datagrams keep
    /// their order; that endpoint hands it on to its owner as its own socket's
    /// datagrams). An endpoint closes when its worker has nothing left to drain: the
    /// next one is tried.
    pub(crate) fn pass(&self, cid: &[u8], datagram: Handover) -> Passed {
        let n = self.inboxes.len();
        let first = usize::from(cid.last().copied().unwrap_or(0)) % n;
        let mut message = None;
        for (inbox, gone) in (0..n).map(|i| &self.inboxes[(first + i) % n]) {
            if gone.load(Ordering::Relaxed) {
                continue;
            }
            let message = message.get_or_insert_with(|| {
                let mut message = Vec::with_capacity(HEADER + datagram.data.len());
                encode(&datagram, &mut message);
                message
            });
            match inbox.send(message) {
                Ok(_) => return Passed::Taken,
                // ECONNREFUSED: the other end is closed.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ECONNREFUSED | libc::ENOTCONN)) => {
                    gone.store(true, Ordering::Relaxed)
                }
                // Full (or another passing trouble, ENOBUFS): this datagram is lost, as
                // a full socket buffer would lose it; the endpoint is not given up.
                Err(_) => return Passed::Dropped,
            }
        }
        Passed::Gone(datagram)
    }
}

/// Each end of an endpoint's inbox pair holds this much (the default, about 208 KiB,
/// is a burst of ~140 datagrams): a second or more of a drain's datagrams at the rates
/// a loopback client reaches, before any is dropped.
const INBOX_BUFFER: usize = 4 << 20;

/// An endpoint's inbox pair: its end, and the one a successor is sent. Both ends ask
/// for [`INBOX_BUFFER`] (the kernel caps it at `net.core.wmem_max`/`rmem_max` without
/// CAP_NET_ADMIN).
pub fn inbox_pair() -> io::Result<(UnixDatagram, UnixDatagram)> {
    let (ours, theirs) = UnixDatagram::pair()?;
    for end in [&ours, &theirs] {
        let socket = socket2::SockRef::from(end);
        let _ = socket.set_send_buffer_size(INBOX_BUFFER);
        let _ = socket.set_recv_buffer_size(INBOX_BUFFER);
    }
    Ok((ours, theirs))
}

/// The header before a datagram passed: version, ECN (0: none), the client's address
/// (family, 16 address bytes, port) and the address it was sent to (family or 0, 16
/// address bytes).
pub(crate) const HEADER: usize = 2 + 19 + 17;
const VERSION: u8 = 1;

/// `datagram` as a message for the predecessor's inbox.
pub(crate) fn encode(datagram: &Handover, out: &mut Vec<u8>) {
    out.push(VERSION);
    out.push(datagram.ecn.map_or(0, |e| e as u8));
    let (family, ip) = ip_bytes(Some(datagram.remote.ip()));
    out.push(family);
    out.extend_from_slice(&ip);
    out.extend_from_slice(&datagram.remote.port().to_be_bytes());
    let (family, ip) = ip_bytes(datagram.local_ip);
    out.push(family);
    out.extend_from_slice(&ip);
    out.extend_from_slice(&datagram.data);
}

/// A message from the successor as the datagram it passed; `None` if it is not one.
pub(crate) fn decode(message: &[u8]) -> Option<Handover> {
    let header = message.get(..HEADER)?;
    if header[0] != VERSION {
        return None;
    }
    let ecn = match header[1] {
        0 => None,
        bits => Some(EcnCodepoint::from_bits(bits)?),
    };
    let remote_ip = ip_of(header[2], &header[3..19])??;
    let port = u16::from_be_bytes([header[19], header[20]]);
    let local_ip = ip_of(header[21], &header[22..38])?;
    Some(Handover {
        remote: SocketAddr::new(remote_ip, port),
        local_ip,
        ecn,
        data: BytesMut::from(&message[HEADER..]),
    })
}

fn ip_bytes(ip: Option<IpAddr>) -> (u8, [u8; 16]) {
    let mut bytes = [0u8; 16];
    match ip {
        None => (0, bytes),
        Some(IpAddr::V4(v4)) => {
            bytes[..4].copy_from_slice(&v4.octets());
            (4, bytes)
        }
        Some(IpAddr::V6(v6)) => (6, v6.octets()),
    }
}

/// The address of family `family` in `bytes`: `Some(None)` for none, `None` for a
/// family that is not one.
fn ip_of(family: u8, bytes: &[u8]) -> Option<Option<IpAddr>> {
    match family {
        0 => Some(None),
        4 => {
            let v4: [u8; 4] = bytes.get(..4)?.try_into().ok()?;
            Some(Some(IpAddr::V4(Ipv4Addr::from(v4))))
        }
        6 => {
            let v6: [u8; 16] = bytes.try_into().ok()?;
            Some(Some(IpAddr::V6(Ipv6Addr::from(v6))))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_passed_arrives_as_it_was_read() {
        for (remote, local_ip, ecn) in [
            ("192.0.2.7:4433", None, None),
            (
                "[2001:db8::1]:443",
                Some("2001:db8::2"),
                Some(EcnCodepoint::Ce),
            ),
            ("127.0.0.1:1", Some("127.0.0.1"), Some(EcnCodepoint::Ect0)),
        ] {
            let datagram = Handover {
                remote: remote.parse().unwrap(),
                local_ip: local_ip.map(|ip| ip.parse().unwrap()),
                ecn,
                data: BytesMut::from(&b"\x40quic"[..]),
            };
            let mut message = Vec::new();
            encode(&datagram, &mut message);
            let back = decode(&message).unwrap();
            assert_eq!(back.remote, datagram.remote);
            assert_eq!(back.local_ip, datagram.local_ip);
            assert_eq!(back.ecn, datagram.ecn);
            assert_eq!(back.data, datagram.data);
        }
    }

    #[test]
    fn what_is_not_a_passed_datagram_is_refused() {
        assert!(decode(&[VERSION; 10]).is_none());
        let mut message = vec![0u8; HEADER + 4];
        assert!(decode(&message).is_none(), "version 0");
        message[0] = VERSION;
        message[2] = 9;
        assert!(decode(&message).is_none(), "no such family");
        message[2] = 0;
        assert!(decode(&message).is_none(), "a client without an address");
    }

    #[test]
    fn an_endpoint_closed_passes_to_the_next_and_none_left_hands_it_back() {
        let pairs: Vec<_> = (0..3).map(|_| UnixDatagram::pair().unwrap()).collect();
        let (ours, mut theirs): (Vec<_>, Vec<_>) = pairs.into_iter().unzip();
        let predecessor = Predecessor::new(ours).unwrap().unwrap();
        let datagram = || Handover {
            remote: "127.0.0.1:9".parse().unwrap(),
            local_ip: None,
            ecn: None,
            data: BytesMut::from(&b"y"[..]),
        };
        // The ID's last byte picks endpoint 1; closed, endpoint 2 takes it.
        theirs[1] = UnixDatagram::unbound().unwrap();
        assert!(matches!(predecessor.pass(&[1], datagram()), Passed::Taken));
        let mut buf = [0u8; 64];
        theirs[2].set_nonblocking(true).unwrap();
        assert!(
            theirs[2].recv(&mut buf).is_ok(),
            "passed to the next endpoint"
        );
        theirs.clear();
        assert!(matches!(
            predecessor.pass(&[1], datagram()),
            Passed::Gone(_)
        ));
    }

    #[test]
    fn a_predecessor_gone_hands_the_datagram_back() {
        let (ours, theirs) = UnixDatagram::pair().unwrap();
        let predecessor = Predecessor::new(vec![ours]).unwrap().unwrap();
        let datagram = || Handover {
            remote: "127.0.0.1:9".parse().unwrap(),
            local_ip: None,
            ecn: None,
            data: BytesMut::from(&b"x"[..]),
        };
        assert!(matches!(predecessor.pass(b"c", datagram()), Passed::Taken));
        let mut buf = [0u8; 64];
        let n = theirs.recv(&mut buf).unwrap();
        assert_eq!(decode(&buf[..n]).unwrap().data, &b"x"[..]);
        drop(theirs);
        assert!(matches!(
            predecessor.pass(b"c", datagram()),
            Passed::Gone(_)
        ));
        assert!(matches!(
            predecessor.pass(b"c", datagram()),
            Passed::Gone(_)
        ));
    }
}
