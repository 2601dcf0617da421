//! The admin listener as anyone who reaches its port can use it: it runs on terminus's
//! own HTTP/1.1 server, so a connection that never finishes its request is closed at
//! the site's `timeouts.request_header`, and it holds at most 64 connections at once,
//! 8 from one address (more are closed at accept), so that under a small descriptor
//! limit the TLS listeners keep the descriptors they need; when all 64 are taken a
//! newcomer takes the oldest place of the address holding the most, so that neither
//! one host nor several together can leave another's scraper no room.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::*;

/// Whether the server has closed `s` (end of stream or reset), waiting up to `wait`;
/// what it sent first (a 408) is read and passed over.
fn closed(s: &mut TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// 120 connections holding `GET /metr` on the admin listener of a server whose
/// descriptors are limited to 128, from one address: at most 8 are kept (the rest
/// closed at once), another address's scrape is answered and the TLS listener keeps
/// serving while they are held, each kept one is closed by the 2 s request-header
/// deadline, and the admin listener answers afterwards. With
/// hyper's server there (no deadline, no cap) all 120 stayed open and the TLS listener
/// stopped accepting ("Too many open files").
#[test]
fn partial_requests_on_the_admin_listener_are_capped_and_cut_at_the_header_deadline() {
    let (_dir, server) = admin_server("admin-limits", "2s");
    let limited = run(Command::new("prlimit")
        .arg(format!("--pid={}", server.pid()))
        .arg("--nofile=128:128"));
    assert!(limited.status.success(), "{limited:?}");
    let admin = server.admin.expect("an admin listener");
    let mut held: Vec<TcpStream> = (0..120)
        .map(|_| {
            let mut s = TcpStream::connect(admin).unwrap();
            s.write_all(b"GET /metr").unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let at_once = held
        .iter_mut()
        .filter_map(|s| closed(s, Duration::from_millis(20)).then_some(()))
        .count();
    assert!(
        at_once >= 120 - 8,
        "{at_once} of 120 closed at accept: the admin listener holds more than 8 from one address"
    );
    // Another address's scraper still finds room.
    let scrape = run(Command::new("curl").args([
        "-sS",
        "--max-time",
        "5",
        "--interface",
        "127.0.0.2",
        &format!("http://{admin}/healthz"),
    ]));
    assert_eq!(
        String::from_utf8_lossy(&scrape.stdout),
        "ok\n",
        "from 127.0.0.2 with 127.0.0.1's connections held: {scrape:?}"
    );
    for i in 0..5 {
        assert_eq!(
            status(&server, &[], "/index.html"),
            200,
            "TLS request {i} with the admin listener's connections held: {}",
            server.stderr()
        );
    }
    let started = Instant::now();
    for (i, s) in held.iter_mut().enumerate() {
        assert!(
            closed(s, Duration::from_secs(5)),
            "admin connection {i} still open {:?} after the 2 s header deadline",
            started.elapsed()
        );
    }
    drop(held);
    let metrics = server.admin_get("/healthz");
    assert_eq!(String::from_utf8_lossy(&metrics.stdout), "ok\n");
    assert!(
        server.metric("terminus_admin_refused_total", &["reason=\"address_full\""]) >= 112.0,
        "{}",
        server.metrics()
    );
}

/// `count` connections from each of `addresses` (127.0.0.x) to `admin`, each holding
/// `GET /metr`, in turn by address.
fn partial_requests_from(
    admin: SocketAddr,
    addresses: std::ops::Range<u8>,
    count: usize,
) -> Vec<TcpStream> {
    addresses
        .flat_map(|last| (0..count).map(move |_| last))
        .map(|last| {
            let mut s = connect_from([127, 0, 0, last].into(), admin);
            s.write_all(b"GET /metr").unwrap();
            s
        })
        .collect()
}

/// How many of `held` the server has closed, once `at_least` are or after `wait`.
fn closed_of(held: &mut [TcpStream], at_least: usize, wait: Duration) -> usize {
    let mut shut = vec![false; held.len()];
    let started = Instant::now();
    loop {
        for (s, shut) in held.iter_mut().zip(shut.iter_mut()) {
            *shut = *shut || closed(s, Duration::from_millis(10));
        }
        let n = shut.iter().filter(|&&c| c).count();
        if n >= at_least || started.elapsed() > wait {
            return n;
        }
    }
}

/// A one-worker server with an admin listener that waits `request_header` for a
/// request's head: connections sending part of one are held until then, or until the
/// listener's caps close them.
fn admin_server(name: &str, request_header: &str) -> (TestDir, Server) {
    let dir = TestDir::new(name);
    dir.write("www/index.html", "hello\n");
    let pair = make_cert(
        dir.path("").as_path(),
        "ecdsa",
        KeyKind::EcdsaP256,
        &["localhost"],
    );
    let conf = Config::new(&dir, &pair).workers(1).before(&format!(
        "[timeouts]\nrequest_header = \"{request_header}\"\n"
    ));
    let server = ServerBuilder::with(&dir, &conf).admin().start();
    (dir, server)
}

/// Eight connections from each of nine addresses, every address within its share of 8:
/// 72 in all, of which the admin listener holds no more than 64 (the rest are closed),
/// so that hosts together cannot spend the descriptors that one host cannot.
#[test]
fn nine_addresses_holding_eight_connections_each_get_no_more_than_64_held() {
    let (_dir, server) = admin_server("admin-all", "60s");
    let admin = server.admin.expect("an admin listener");
    let mut held = partial_requests_from(admin, 10..19, 8);
    let shut = closed_of(&mut held, 72 - 64, Duration::from_secs(5));
    let open = held.len() - shut;
    assert!(
        open <= 64,
        "the admin listener holds {open} of 72 connections from 9 addresses"
    );
    assert_eq!(open, 64, "{shut} of 72 closed with room for 64");
}

/// Eight addresses hold eight connections each, the admin listener's 64: a scrape from a
/// ninth address is answered all the same, in the place of the oldest connection of an
/// address holding the most (closed for it), counted in
/// `terminus_admin_refused_total{reason="evicted"}` and said in a warning.
#[test]
fn a_scrape_from_a_ninth_address_is_answered_while_eight_hold_eight_connections_each() {
    let (_dir, server) = admin_server("admin-evict", "60s");
    let admin = server.admin.expect("an admin listener");
    let mut held = partial_requests_from(admin, 10..18, 8);
    assert_eq!(
        closed_of(&mut held, 1, Duration::from_millis(500)),
        0,
        "64 connections from 8 addresses fit"
    );
    let scrape = run(Command::new("curl").args([
        "-sS",
        "--max-time",
        "5",
        "--interface",
        "127.0.0.20",
        &format!("http://{admin}/healthz"),
    ]));
    assert_eq!(
        String::from_utf8_lossy(&scrape.stdout),
        "ok\n",
        "from a ninth address with 64 held: {scrape:?}"
    );
    assert!(
        closed_of(&mut held, 1, Duration::from_secs(5)) >= 1,
        "none of the 64 closed for the scrape"
    );
    assert!(
        server.metric("terminus_admin_refused_total", &["reason=\"evicted\""]) >= 1.0,
        "{}",
        server.metrics()
    );
    eventually(Duration::from_secs(5), "a warning for the eviction", || {
        server
            .stderr()
            .lines()
            .any(|l| l.contains("WARN") && l.contains("admin listener"))
    });
}
