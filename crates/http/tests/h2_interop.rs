//! The server connection under real clients, before the server uses it: a small h2c
//! server (prior knowledge, plain TCP on loopback) drives [`Connection`] as the server's
//! connection task will, and the `h2` crate's client and h2spec's whole suite talk to it.
//!
//! The server answers `GET /size/N` with N bytes, any other request without a body with
//! 2 KiB (h2spec's flow-control tests need a response larger than the windows they
//! set), and one with a body with the body's length as text once it has ended
//! (trailers included), so that h2spec's tests, which wait for a response, get one.

use std::net::SocketAddr;

use terminus_http::h2::hpack::encoder;
use terminus_http::h2::server::state::{Config, Connection, Event};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Starts the server on its own thread and runtime; returns its address.
fn start() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async move {
            let listener = TcpListener::from_std(listener).unwrap();
            loop {
                let (socket, _) = listener.accept().await.unwrap();
                tokio::task::spawn_local(serve(socket));
            }
        });
    });
    addr
}

/// A response still being sent: its stream and the body bytes left.
struct Sending {
    stream: u32,
    body: Vec<u8>,
}

async fn serve(mut socket: TcpStream) {
    let mut out = Vec::new();
    let config = Config {
        connect_protocol: true,
        ..Config::default()
    };
    let mut conn = Connection::new(config, &mut out);
    // The connection's window opens as far as the caller says (the server's worker
    // budget; here, always all the way).
    conn.open_connection_window(conn.connection_window_wanted(), &mut out);
    let mut input = Vec::new();
    let mut read = vec![0u8; 16 << 10];
    let mut sending: Vec<Sending> = Vec::new();
    // Body bytes received per open stream.
    let mut received: Vec<(u32, usize)> = Vec::new();
    loop {
        if socket.write_all(&out).await.is_err() {
            return;
        }
        out.clear();
        if conn.is_done() {
            // Close as the server's connection does (h2/server `finish`): FIN, then read
            // and drop what the client still sends for a second. Dropping the socket with
            // bytes unread resets it, and h2spec then reads "connection reset by peer"
            // where it waits for the close (seen once in CI under load, test 3.8).
            let _ = socket.shutdown().await;
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), async {
                while matches!(socket.read(&mut read).await, Ok(n) if n > 0) {}
            })
            .await;
            return;
        }
        let n = match socket.read(&mut read).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        input.extend_from_slice(&read[..n]);
        let mut answer: Vec<(u32, Vec<u8>)> = Vec::new();
        let mut taken: Vec<(u32, usize)> = Vec::new();
        let mut gone: Vec<u32> = Vec::new();
        let result = conn.receive(&input, &mut out, &mut |event| match event {
            Event::Request {
                stream,
                head,
                end_stream,
            } => {
                let path = head.path().unwrap_or_default();
                let size = path
                    .strip_prefix(b"/size/")
                    .and_then(|n| std::str::from_utf8(n).ok()?.parse::<usize>().ok());
                match (size, end_stream) {
                    (Some(size), _) => answer.push((stream, vec![b'x'; size])),
                    (None, true) => answer.push((stream, vec![b'x'; 2048])),
                    (None, false) => received.push((stream, 0)),
                }
            }
            Event::Data {
                stream,
                data,
                end_stream,
            } => {
                taken.push((stream, data.len()));
                if let Some(r) = received.iter_mut().find(|r| r.0 == stream) {
                    r.1 += data.len();
                    if end_stream {
                        answer.push((stream, r.1.to_string().into_bytes()));
                    }
                }
            }
            Event::Trailers { stream, .. } => {
                if let Some(r) = received.iter().find(|r| r.0 == stream) {
                    answer.push((stream, r.1.to_string().into_bytes()));
                }
            }
            Event::Reset { stream, .. } => gone.push(stream),
            _ => {}
        });
        match result {
            Ok(n) => {
                input.drain(..n);
            }
            Err(_) => {
                let _ = socket.write_all(&out).await;
                return;
            }
        }
        for (stream, n) in taken {
            conn.release(stream, n, &mut out);
            conn.consumed(n);
        }
        if conn.connection_window_wanted() >= 16 << 10 {
            conn.open_connection_window(conn.connection_window_wanted(), &mut out);
        }
        sending.retain(|s| !gone.contains(&s.stream));
        received.retain(|r| !gone.contains(&r.0) && !answer.iter().any(|a| a.0 == r.0));
        for (stream, body) in answer {
            let len = body.len().to_string();
            conn.send_head(stream, false, &mut out, |b| {
                encoder::status(200, b);
                encoder::field(b"content-length", len.as_bytes(), b);
            });
            sending.push(Sending { stream, body });
        }
        sending.retain_mut(|s| {
            let sent = conn.send_data(s.stream, &s.body, true, &mut out);
            s.body.drain(..sent);
            !s.body.is_empty()
        });
    }
}

/// The `h2` crate's client: concurrent GETs larger than every window (our sending
/// follows its WINDOW_UPDATEs), and a POST larger than ours (its sending follows ours).
#[test]
fn the_h2_crate_client_is_served() {
    let addr = start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let socket = TcpStream::connect(addr).await.unwrap();
        let (client, connection) = h2::client::handshake(socket).await.unwrap();
        tokio::spawn(async move {
            connection.await.unwrap();
        });
        let mut client = client.ready().await.unwrap();
        let mut responses = Vec::new();
        for i in 0..20 {
            let size = 100_000 + i;
            let request = http::Request::get(format!("http://example.com/size/{size}"))
                .body(())
                .unwrap();
            let (response, _) = client.send_request(request, true).unwrap();
            responses.push((size, response));
            client = client.ready().await.unwrap();
        }
        for (size, response) in responses {
            let response = response.await.unwrap();
            assert_eq!(response.status(), 200);
            let mut body = response.into_body();
            let mut got = 0;
            while let Some(chunk) = body.data().await {
                let chunk = chunk.unwrap();
                got += chunk.len();
                body.flow_control().release_capacity(chunk.len()).unwrap();
            }
            assert_eq!(got, size);
        }
        // A 1 MB upload: sixteen of our stream windows.
        let request = http::Request::post("http://example.com/upload")
            .body(())
            .unwrap();
        let (response, mut upload) = client.send_request(request, false).unwrap();
        let total = 1 << 20;
        let mut left = total;
        while left > 0 {
            upload.reserve_capacity(left.min(1 << 16));
            let capacity = std::future::poll_fn(|cx| upload.poll_capacity(cx))
                .await
                .unwrap()
                .unwrap();
            let n = capacity.min(left);
            upload
                .send_data(bytes::Bytes::from(vec![1u8; n]), n == left)
                .unwrap();
            left -= n;
        }
        let mut body = response.await.unwrap().into_body();
        let text = body.data().await.unwrap().unwrap();
        assert_eq!(&text[..], total.to_string().as_bytes());
    });
}

/// h2spec 2.2.1's every test, strict mode, h2c with prior knowledge.
#[test]
fn h2spec_passes_every_test_against_the_connection() {
    let h2spec = terminus_testkit::h2spec();
    if !terminus_testkit::runs_here(
        terminus_testkit::Need::H2spec,
        h2spec.is_some(),
        "no h2spec (.ci/run installs it into target/tools)",
    ) {
        return;
    }
    let addr = start();
    let summary = terminus_testkit::h2spec_passes(&h2spec.unwrap(), addr.port(), false);
    println!("h2spec: {summary}");
}
