//! The coroutine bridge under load: hundreds of concurrent full handshakes from a rustls
//! client, every signature and key exchange counted by the engine.

use std::sync::Arc;
use std::time::Duration;

use crate::harness::*;
use rustls::pki_types::ServerName;
use rustls::RootCertStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

fn client_config(
    ca: &std::path::Path,
    versions: &[&'static rustls::SupportedProtocolVersion],
    kx_op: &str,
) -> Arc<rustls::ClientConfig> {
    let mut roots = RootCertStore::empty();
    let pem = std::fs::read(ca).unwrap();
    for cert in rustls_pemfile::certs(&mut &pem[..]) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    // Offer only the group under test, named as the engine's metrics name it.
    provider.kx_groups.retain(|g| {
        let name = match g.name() {
            rustls::NamedGroup::X25519 => "x25519",
            rustls::NamedGroup::secp256r1 => "p256",
            rustls::NamedGroup::secp384r1 => "p384",
            rustls::NamedGroup::X25519MLKEM768 => "x25519mlkem768",
            _ => "",
        };
        name == kx_op
    });
    assert_eq!(provider.kx_groups.len(), 1, "{kx_op}");
    let provider = Arc::new(provider);
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.resumption = rustls::client::Resumption::disabled();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

async fn one_request(addr: std::net::SocketAddr, connector: TlsConnector) -> Result<(), String> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tls.write_all(b"GET /0kb.bin HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut response = Vec::new();
    tls.read_to_end(&mut response)
        .await
        .map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&response);
    if text.starts_with("HTTP/1.1 200") && text.to_ascii_lowercase().contains("content-length: 0") {
        Ok(())
    } else {
        Err(format!("unexpected response: {text}"))
    }
}

/// Runs `count` connections at once, half TLS 1.3 and half TLS 1.2, key exchange by
/// `kx_op` only.
fn storm(server: &Server, ca: &std::path::Path, kx_op: &str, count: usize) -> Vec<String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tls13 = TlsConnector::from(client_config(ca, &[&rustls::version::TLS13], kx_op));
    // Half the handshakes TLS 1.2, where the group has it (the hybrid is TLS 1.3 only).
    let tls12 = (!kx_op.contains("mlkem"))
        .then(|| TlsConnector::from(client_config(ca, &[&rustls::version::TLS12], kx_op)));
    let addr = server.addr;
    rt.block_on(async move {
        let tasks: Vec<_> = (0..count)
            .map(|i| {
                let connector = match &tls12 {
                    Some(tls12) if i % 2 == 1 => tls12.clone(),
                    _ => tls13.clone(),
                };
                tokio::spawn(tokio::time::timeout(
                    Duration::from_secs(60),
                    one_request(addr, connector),
                ))
            })
            .collect();
        let mut errors = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => errors.push(e),
                Err(_) => errors.push("timed out".into()),
            }
        }
        errors
    })
}

/// Runs `count` concurrent full handshakes against a server on `backend`, key exchange by
/// `kx_op`, and checks the engine saw every operation; returns the final metrics text.
fn run_storm(backend: &str, key: KeyKind, key_op: &str, kx_op: &str, count: usize) -> String {
    run_storm_beside(backend, key, key_op, kx_op, count, false)
}

/// [`run_storm`], with `keep_alive`: while keep-alive requests keep the workers from
/// ever running out of work (so no batch is computed for want of company).
fn run_storm_beside(
    backend: &str,
    key: KeyKind,
    key_op: &str,
    kx_op: &str,
    count: usize,
    keep_alive: bool,
) -> String {
    let dir = TestDir::new("storm");
    let pair = make_cert(&dir.0, "k", key, &["localhost"]);
    dir.write("www/0kb.bin", "");
    let server = ServerBuilder::flags(&[
        "--cert",
        pair.cert.to_str().unwrap(),
        "--key",
        pair.key.to_str().unwrap(),
        "--root",
        dir.path("www").to_str().unwrap(),
        "--crypto-backend",
        backend,
        "--no-resumption",
        "--workers",
        "2",
    ])
    .admin()
    .start();
    let mut traffic = keep_alive.then(|| {
        std::process::Command::new(terminus_bin())
            .args([
                "load",
                &server.url("/0kb.bin"),
                "-k",
                "-c",
                "32",
                "-d",
                "60s",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    });
    if traffic.is_some() {
        // Its 32 connections' handshakes done before the storm's are counted from here.
        eventually(
            Duration::from_secs(20),
            "the keep-alive connections",
            || server.metric("terminus_handshakes_total", &[]) >= 32.0,
        );
    }
    // What the keep-alive client's own handshakes counted is not the storm's.
    let before = server.metrics();
    let errors = storm(&server, &pair.cert, kx_op, count);
    if let Some(traffic) = &mut traffic {
        let _ = traffic.kill();
        let _ = traffic.wait();
    }
    assert!(
        errors.is_empty(),
        "{} of {count} failed, first: {:?}",
        errors.len(),
        errors.first()
    );

    let m = server.metrics();
    let label = format!("backend=\"{backend}\"");
    let storm_sum = |name: &str, labels: &[&str]| {
        metric_sum(&m, name, labels) - metric_sum(&before, name, labels)
    };
    let full = storm_sum(
        "terminus_handshakes_total",
        &[&format!(
            "key_type=\"{}\"",
            key_op.trim_end_matches("_sign")
        )],
    );
    assert_eq!(
        full as usize, count,
        "every handshake is a full one, signed with the key\n{m}"
    );
    let signs = storm_sum(
        "terminus_crypto_requests_total",
        &[&format!("op=\"{key_op}\""), &label],
    );
    assert_eq!(signs as usize, count, "one engine signature per handshake");
    // TLS 1.3: one generate-and-agree request; TLS 1.2: generate, then agree.
    let kx = storm_sum(
        "terminus_crypto_requests_total",
        &[&format!("op=\"{kx_op}\""), &label],
    );
    let tls13 = if kx_op.contains("mlkem") {
        count
    } else {
        count.div_ceil(2)
    };
    assert_eq!(
        kx as usize,
        tls13 + 2 * (count - tls13),
        "key exchanges through the engine"
    );
    assert_eq!(metric_sum(&m, "terminus_crypto_errors_total", &[]), 0.0);
    assert_eq!(
        metric_sum(&m, "terminus_crypto_sync_fallbacks_total", &[]),
        0.0,
        "nothing bypassed the engine"
    );
    assert_eq!(
        metric_sum(&m, "terminus_crypto_queue_depth", &[]),
        0.0,
        "nothing left in flight"
    );
    m
}

/// Mean batch size of `op` in a metrics text.
fn mean_batch(m: &str, op: &str) -> f64 {
    let label = format!("op=\"{op}\"");
    metric_sum(m, "terminus_crypto_batched_requests_total", &[&label])
        / metric_sum(m, "terminus_crypto_batches_total", &[&label])
}

#[test]
fn five_hundred_concurrent_rsa_handshakes_through_threads_backend() {
    run_storm("threads", KeyKind::Rsa(2048), "rsa_sign", "x25519", 500);
}

#[test]
fn five_hundred_concurrent_ecdsa_handshakes_through_threads_backend() {
    run_storm("threads", KeyKind::EcdsaP256, "ecdsa_sign", "x25519", 500);
}

#[test]
fn six_hundred_concurrent_rsa_handshakes_fill_multibuffer_batches() {
    if !crate::harness::ifma() {
        return;
    }
    let m = run_storm("multibuffer", KeyKind::Rsa(2048), "rsa_sign", "x25519", 600);
    let rsa = mean_batch(&m, "rsa_sign");
    let x25519 = mean_batch(&m, "x25519");
    println!("mean batch: rsa_sign {rsa:.2}, x25519 {x25519:.2}");
    // The crossovers of the certificate's key and the groups were measured at start-up.
    for op in ["rsa2048", "x25519", "ecdhp256", "ecdhp384"] {
        let crossover = metric_sum(
            &m,
            "terminus_crypto_crossover",
            &[&format!("op=\"{op}\""), "measured=\"1\""],
        );
        // 9 is "never": RSA-2048 and X25519 must batch where IFMA runs.
        let most = if ["rsa2048", "x25519"].contains(&op) {
            8.0
        } else {
            9.0
        };
        assert!(crossover >= 1.0 && crossover <= most, "{op} measured\n{m}");
    }
    assert!(
        rsa >= 4.0,
        "RSA batches mostly full: mean {rsa:.2} of 8\n{m}"
    );
    assert!(x25519 >= 2.0, "X25519 batched: mean {x25519:.2}\n{m}");
    // The histograms agree with the counters.
    let op = "op=\"rsa_sign\"";
    let batches = metric_sum(&m, "terminus_crypto_batches_total", &[op]);
    assert_eq!(
        metric_sum(&m, "terminus_crypto_batch_size_count", &[op]),
        batches
    );
    assert_eq!(
        metric_sum(
            &m,
            "terminus_crypto_batch_size_bucket",
            &[op, "le=\"+Inf\""]
        ),
        batches
    );
    assert_eq!(
        metric_sum(&m, "terminus_crypto_dispatch_seconds_count", &[op]),
        batches
    );
    assert_eq!(
        metric_sum(&m, "terminus_crypto_queue_wait_seconds_count", &[op]),
        600.0
    );
    let full = metric_sum(&m, "terminus_crypto_batch_size_bucket", &[op, "le=\"8\""])
        - metric_sum(&m, "terminus_crypto_batch_size_bucket", &[op, "le=\"7\""]);
    assert!(
        full >= batches / 2.0,
        "most batches have 8 requests: {full} of {batches}"
    );
}

#[test]
fn six_hundred_concurrent_ecdsa_handshakes_fill_multibuffer_batches() {
    if !crate::harness::ifma() {
        return;
    }
    let m = run_storm(
        "multibuffer",
        KeyKind::EcdsaP256,
        "ecdsa_sign",
        "x25519",
        600,
    );
    assert_batched(&m, "ecdsa_sign", 4.0);
}

/// P-384 signatures are cheap next to the storm's clients: the worker goes idle between
/// their ClientHellos, and a worker about to sleep computes what waits at once (flush on
/// idle: a lone handshake never waits for company). So batched at all (a mean of 2) is
/// what is owed here; full batches come with a worker that never runs out of work (the
/// next test, and bench/rtt-latency).
#[test]
fn six_hundred_concurrent_p384_handshakes_with_p256_key_exchange_are_batched() {
    if !crate::harness::ifma() {
        return;
    }
    let m = run_storm("multibuffer", KeyKind::EcdsaP384, "ecdsa_sign", "p256", 600);
    assert_batched(&m, "ecdsa_sign", 2.0);
    assert_batched(&m, "p256", 2.0);
}

/// The same storm while keep-alive requests keep both workers busy: a worker that never
/// sleeps computes a batch when it is full or its oldest request has waited
/// `max_batch_delay`, so the signatures' batches hold three requests or more on average.
/// Not "mostly full" (4), as this test said until 2026-11-26: on a 2-core machine the
/// clients share the workers' cores and the workers do sleep, and the mean batch falls in
/// two modes, ~7.5 and 4.0-4.7, about half the runs each, with the same spread before and
/// after that day's changes (10 runs each: 4.10-7.61 at af06830, 4.00-7.44 after); CI
/// fails the lower mode against 4.
#[test]
fn six_hundred_concurrent_p384_handshakes_beside_keep_alive_traffic_batch_three_or_more() {
    if !crate::harness::ifma() {
        return;
    }
    let m = run_storm_beside(
        "multibuffer",
        KeyKind::EcdsaP384,
        "ecdsa_sign",
        "p256",
        600,
        true,
    );
    assert_batched(&m, "ecdsa_sign", 3.0);
}

/// The mean batch of `op` is at least `least` (4: mostly full; 2: batched at all).
fn assert_batched(m: &str, op: &str, least: f64) {
    let mean = mean_batch(m, op);
    println!("mean batch: {op} {mean:.2}");
    assert!(
        mean >= least,
        "{op}: mean batch {mean:.2}, want {least}\n{m}"
    );
}

/// The post-quantum hybrid under load: every handshake's ML-KEM part and X25519 half in
/// the engine, the X25519 halves batched in the hybrid's own queue.
#[test]
fn six_hundred_concurrent_hybrid_key_exchanges_fill_multibuffer_batches() {
    if !crate::harness::ifma() {
        return;
    }
    let m = run_storm(
        "multibuffer",
        KeyKind::EcdsaP256,
        "ecdsa_sign",
        "x25519mlkem768",
        600,
    );
    assert_batched(&m, "x25519mlkem768", 2.0);
    assert_eq!(
        metric_sum(&m, "terminus_crypto_requests_total", &["op=\"x25519\""]),
        0.0,
        "no hybrid counted as plain X25519"
    );
}
