//! Ports for what a test must name before it starts (an ACME CA, Redis, an upstream, a
//! listener in a config file), free when handed out and not taken before they are bound.
//!
//! Binding port 0, reading the port and closing the socket (the way this used to be done)
//! hands out a port of the kernel's ephemeral range (`net.ipv4.ip_local_port_range`),
//! which every other socket that does not name its port draws from too: every outgoing
//! connection, every `bind` to port 0 (each test's own servers). Between the close and
//! the server's bind, another test's socket could take it, and once did in CI. The
//! cheapest fix that keeps the callers as they are (a port number, bound later by a
//! process of the test's choosing) is to hand out ports the kernel never picks by
//! itself: ports outside the ephemeral range, which only an explicit bind takes. Within
//! the process a sequence never hands out a port twice; its start is spread by the
//! process id so that test binaries running at once (other suites on the machine) walk
//! different stretches; and a port something already holds, TCP or UDP (a server, a QUIC
//! listener, another process's pick), is skipped. What remains is another process binding
//! the very same port explicitly in the moment between our check and the caller's bind.
//! Holding a socket open until the server binds (SO_REUSEPORT) would close that too, but
//! every caller would have to keep and hand it on, and Pebble or Redis cannot take one.

use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// The lowest port handed out: below it are the ports services and examples commonly
/// use (8080, 8443, 9090, ...).
const LOWEST: u32 = 20_000;

/// The fewest ports worth a range of their own.
const ENOUGH: u32 = 1_000;

/// A port free for both TCP and UDP (on 127.0.0.1 and 0.0.0.0), outside the kernel's
/// ephemeral range, never handed out before by this process (see the module's
/// documentation). Panics if there is none.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static RANGE: OnceLock<Option<Range<u32>>> = OnceLock::new();
    let range = RANGE.get_or_init(|| outside(ephemeral_range()));
    let Some(range) = range.clone() else {
        // The ephemeral range leaves no room (set to nearly every port): the kernel's pick,
        // racy as described, is all there is.
        return TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .expect("bind a port")
            .port();
    };
    let start = spread(std::process::id(), range.len() as u32);
    free_port_in(range.clone(), &NEXT, start)
        .unwrap_or_else(|| panic!("no free port left in {range:?}"))
}

/// The next port of `range` in the sequence `next` counts (from `start` within it) that
/// TCP and UDP can both bind now ([`bindable`]); None once the whole range was walked.
fn free_port_in(range: Range<u32>, next: &AtomicU32, start: u32) -> Option<u16> {
    let span = range.len() as u32;
    (0..span).find_map(|_| {
        let n = next.fetch_add(1, Ordering::Relaxed);
        let port = u16::try_from(range.start + (start.wrapping_add(n)) % span).ok()?;
        bindable(port).then_some(port)
    })
}

/// Whether nothing holds `port`, TCP or UDP: bound on 0.0.0.0, which any IPv4 address's
/// listener or UDP socket on the port refuses (and a dual-stack [::] one), so the port
/// is free on 127.0.0.1 and for a server on 0.0.0.0 alike.
fn bindable(port: u16) -> bool {
    let tcp = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port));
    let udp = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port));
    tcp.is_ok() && udp.is_ok()
}

/// The kernel's ephemeral range, inclusive; Linux's default where it cannot be read.
fn ephemeral_range() -> (u32, u32) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut ends = text.split_whitespace().map(|n| n.parse::<u32>().ok());
            Some((ends.next()??, ends.next()??))
        })
        .unwrap_or((32_768, 60_999))
}

/// The larger stretch of ports from [`LOWEST`] up that lies outside `ephemeral`
/// (inclusive), if it has [`ENOUGH`] ports.
fn outside((low, high): (u32, u32)) -> Option<Range<u32>> {
    let below = LOWEST..low.max(LOWEST);
    let above = (high + 1).max(LOWEST)..65_536;
    let larger = if below.len() >= above.len() {
        below
    } else {
        above
    };
    (larger.len() as u32 >= ENOUGH).then_some(larger)
}

/// Where process `pid` starts in a range of `span` ports: consecutive process ids (test
/// binaries started one after another) land far apart.
fn spread(pid: u32, span: u32) -> u32 {
    ((u64::from(pid).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % u64::from(span)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn ports_are_distinct_free_and_outside_the_ephemeral_range() {
        let (low, high) = ephemeral_range();
        let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
        let distinct: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        for &port in &ports {
            assert!(
                !(low..=high).contains(&u32::from(port)),
                "port {port} is in the ephemeral range {low}-{high}: another socket can take it"
            );
            assert!(bindable(port), "port {port} was handed out taken");
        }
    }

    #[test]
    fn threads_asking_at_once_get_distinct_ports() {
        let threads: Vec<_> = (0..8)
            .map(|_| std::thread::spawn(|| (0..50).map(|_| free_port()).collect::<Vec<_>>()))
            .collect();
        let ports: Vec<u16> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        let distinct: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len());
    }

    #[test]
    fn a_port_held_by_tcp_or_udp_is_skipped() {
        let held = free_port();
        let range = u32::from(held)..u32::from(held) + 2;
        {
            let _udp = UdpSocket::bind((Ipv4Addr::LOCALHOST, held)).unwrap();
            let got = free_port_in(range.clone(), &AtomicU32::new(0), 0);
            assert_ne!(got, Some(held), "a port a UDP socket holds was handed out");
        }
        {
            let _tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, held)).unwrap();
            let got = free_port_in(range.clone(), &AtomicU32::new(0), 0);
            assert_ne!(
                got,
                Some(held),
                "a port a TCP listener holds was handed out"
            );
        }
        // Free again: handed out.
        assert_eq!(free_port_in(range, &AtomicU32::new(0), 0), Some(held));
    }

    #[test]
    fn the_sequence_walks_its_range_once() {
        let held = free_port();
        let _tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, held)).unwrap();
        let range = u32::from(held)..u32::from(held) + 1;
        assert_eq!(free_port_in(range, &AtomicU32::new(0), 0), None);
    }

    #[test]
    fn the_range_avoids_the_ephemeral_one() {
        assert_eq!(outside((32_768, 60_999)), Some(20_000..32_768));
        assert_eq!(outside((10_000, 40_000)), Some(40_001..65_536));
        assert_eq!(outside((1_024, 65_535)), None);
        assert_eq!(outside((20_500, 65_000)), None);
        assert_eq!(spread(1000, 12_768), spread(1000, 12_768));
        assert!(spread(1000, 12_768).abs_diff(spread(1001, 12_768)) > 100);
    }
}
