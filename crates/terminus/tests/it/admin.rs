//! The admin listener as anyone who reaches its port can use it: it runs on terminus's
//! own HTTP/1.1 server, so a connection that never finishes its request is closed at
//! the site's `timeouts.request_header`, and it holds at most 64 connections at once,
//! 8 from one address (more are closed at accept), so that under a small descriptor
//! limit the TLS listeners keep the descriptors they need and one host cannot leave
//! another's scraper no room.

use std::io::{Read, Write};
use std::net::TcpStream;
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
    let dir = TestDir::new("admin-limits");
    dir.write("www/index.html", "hello\n");
    let pair = make_cert(
        dir.path("").as_path(),
        "ecdsa",
        KeyKind::EcdsaP256,
        &["localhost"],
    );
    let conf = Config::new(&dir, &pair)
        .workers(1)
        .before("[timeouts]\nrequest_header = \"2s\"\n");
    let server = ServerBuilder::with(&dir, &conf).admin().start();
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
}
