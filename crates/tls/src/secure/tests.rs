//! SecureStream over loopback TCP, its peer rustls's buffered client driven over the
//! socket by hand (so that a test can ask it for a KeyUpdate or send raw bytes).

use std::future::poll_fn;
use std::io::{Read, Write};
use std::time::Duration;

use rustls::client::ClientConnection;
use rustls::AlertDescription;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::pool;
use crate::record::testing::{all_suites, handshake};
use crate::record::MAX_PLAINTEXT;

/// The client's end: a socket and rustls's connection.
struct Peer {
    sock: TcpStream,
    conn: ClientConnection,
}

impl Peer {
    /// Sends `data` (in records rustls makes) and whatever rustls has queued.
    async fn send(&mut self, data: &[u8]) {
        for chunk in data.chunks(MAX_PLAINTEXT) {
            self.conn.writer().write_all(chunk).unwrap();
            self.flush().await;
        }
    }

    async fn flush(&mut self) {
        let mut out = Vec::new();
        while self.conn.wants_write() {
            self.conn.write_tls(&mut out).unwrap();
        }
        self.sock.write_all(&out).await.unwrap();
    }

    /// Raw bytes, as one read of the socket gives them (5 s at most).
    async fn recv_raw(&mut self) -> Vec<u8> {
        let mut buf = vec![0; 64 * 1024];
        let n = tokio::time::timeout(Duration::from_secs(5), self.sock.read(&mut buf))
            .await
            .expect("bytes within 5 s")
            .unwrap();
        buf.truncate(n);
        buf
    }

    /// Feeds raw bytes to rustls: the plaintext, or rustls's error.
    fn take(&mut self, raw: &[u8]) -> Result<Vec<u8>, rustls::Error> {
        let mut rest = raw;
        let mut plain = Vec::new();
        while !rest.is_empty() {
            self.conn.read_tls(&mut rest).unwrap();
            self.conn.process_new_packets()?;
            match self.conn.reader().read_to_end(&mut plain) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        Ok(plain)
    }

    /// Reads until `n` bytes of plaintext came.
    async fn recv(&mut self, n: usize) -> Vec<u8> {
        let mut plain = Vec::new();
        while plain.len() < n {
            let raw = self.recv_raw().await;
            assert!(!raw.is_empty(), "the server closed early");
            plain.extend(self.take(&raw).unwrap());
        }
        plain
    }
}

/// A SecureStream for `layer` and the client that shook hands with it.
async fn connect(
    layer: RecordLayer<ServerConnectionData>,
    conn: ClientConnection,
    pending: Vec<u8>,
) -> (SecureStream, Peer) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sock = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (from, _) = listener.accept().await.unwrap();
    let counters = Arc::new(TrafficCounters::default());
    let server = SecureStream::new(from, layer, pending, counters).unwrap();
    (server, Peer { sock, conn })
}

/// The first suite (TLS 1.3, AES-128-GCM), or suite `i` of [`all_suites`].
async fn pair(i: usize) -> (SecureStream, Peer) {
    let (suite, version) = all_suites()[i];
    let (conn, layer) = handshake(suite, version).layer();
    connect(layer, conn, Vec::new()).await
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[tokio::test]
async fn request_and_response_for_every_suite() {
    for i in 0..all_suites().len() {
        let (mut server, mut peer) = pair(i).await;
        peer.send(b"GET / HTTP/1.1\r\n\r\n").await;
        let mut request = [0u8; 18];
        server.read_exact(&mut request).await.unwrap();
        assert_eq!(&request, b"GET / HTTP/1.1\r\n\r\n");
        let body = pattern(70_000, 1);
        server.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
        server.write_all(&body).await.unwrap();
        server.flush().await.unwrap();
        let response = peer.recv(19 + body.len()).await;
        assert_eq!(&response[..19], b"HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(&response[19..], &body[..]);
        assert!(!server.holds_buffers(), "idle after the response");
    }
}

#[tokio::test]
async fn a_head_and_body_written_apart_leave_as_one_record() {
    let (mut server, mut peer) = pair(0).await;
    let head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n";
    server.write_all(head).await.unwrap();
    server.write_all(b"hello").await.unwrap();
    server.flush().await.unwrap();
    let raw = peer.recv_raw().await;
    let len = u16::from_be_bytes([raw[3], raw[4]]) as usize;
    assert_eq!(raw.len(), 5 + len, "one record");
    assert_eq!(len, head.len() + 5 + 17);
    let plain = peer.take(&raw).unwrap();
    assert_eq!(&plain[..head.len()], head);
    assert_eq!(&plain[head.len()..], b"hello");
}

/// Whether the server side is ready to read, polled once.
fn ready_now(stream: &mut SecureStream) -> bool {
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    match stream.poll_read_ready(&mut cx) {
        Poll::Ready(r) => r.map(|()| true).unwrap(),
        Poll::Pending => false,
    }
}

/// Waits (5 s at most) for the server side to be ready to read.
async fn becomes_ready(stream: &mut SecureStream, when: &str) {
    tokio::time::timeout(
        Duration::from_secs(5),
        poll_fn(|cx| stream.poll_read_ready(cx)),
    )
    .await
    .unwrap_or_else(|_| panic!("not ready {when}"))
    .unwrap();
}

/// Ready is what a read will find: not before a record comes; at once while plaintext
/// is left unread (two requests in one record, the second read without touching the
/// socket); not once it is all read; and at the end of the stream.
#[tokio::test]
async fn read_ready_says_when_a_read_would_not_wait() {
    let (mut server, mut peer) = pair(0).await;
    assert!(!ready_now(&mut server), "ready with nothing sent");
    peer.send(b"first\nsecond\n").await;
    becomes_ready(&mut server, "once the record came").await;
    let mut first = [0u8; 6];
    server.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"first\n");
    assert!(ready_now(&mut server), "the rest of the record is unread");
    let mut second = [0u8; 7];
    server.read_exact(&mut second).await.unwrap();
    assert_eq!(&second, b"second\n");
    assert!(!ready_now(&mut server), "ready with everything read");
    assert!(!server.holds_buffers(), "idle: no buffer");
    peer.conn.send_close_notify();
    peer.flush().await;
    becomes_ready(&mut server, "at the end of the stream").await;
    assert_eq!(server.read(&mut first).await.unwrap(), 0);
}

/// Records the handshake read past its end are opened before the socket is read: whole
/// ones with nothing on the socket, and the head of one completed from it.
#[tokio::test]
async fn pending_records_are_read_first() {
    let (suite, version) = all_suites()[3];
    let (mut conn, layer) = handshake(suite, version).layer();
    let mut flight = Vec::new();
    for part in [&b"one "[..], b"two ", b"three"] {
        conn.writer().write_all(part).unwrap();
        conn.write_tls(&mut flight).unwrap();
    }
    let cut = flight.len() - 10;
    let (mut server, mut peer) = connect(layer, conn, flight[..cut].to_vec()).await;
    let mut first = [0u8; 8];
    server.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"one two ");
    peer.sock.write_all(&flight[cut..]).await.unwrap();
    let mut rest = [0u8; 5];
    server.read_exact(&mut rest).await.unwrap();
    assert_eq!(&rest, b"three");
    assert!(!server.holds_buffers());
}

/// The client asks for our KeyUpdate and waits for it before sending its request; the
/// server is only reading, and answers.
#[tokio::test]
async fn a_key_update_is_answered_while_the_server_only_reads() {
    let (mut server, mut peer) = pair(0).await;
    let mut request = [0u8; 7];
    let server_reads = async {
        server.read_exact(&mut request).await.unwrap();
        server
    };
    let client = async {
        peer.conn.refresh_traffic_keys().unwrap();
        peer.flush().await;
        let answer = peer.recv_raw().await;
        assert_eq!(answer.len(), 5 + 5 + 17, "one KeyUpdate came");
        assert_eq!(peer.take(&answer).unwrap(), b"");
        peer.send(b"request").await;
        peer
    };
    let (mut server, mut peer) = tokio::join!(server_reads, client);
    assert_eq!(&request, b"request");
    server.write_all(b"response").await.unwrap();
    server.flush().await.unwrap();
    assert_eq!(peer.recv(8).await, b"response");
    assert_eq!(
        server.record_layer().tx_seq(),
        1,
        "sealed under the new key"
    );
}

/// 16 MiB each way: the client updates its keys every 4 MiB; our write key's limit is
/// set low, so that our own KeyUpdates are forced every 100 records.
#[tokio::test]
async fn sixteen_mib_both_ways_across_key_updates() {
    const TOTAL: usize = 16 << 20;
    let (suite, version) = all_suites()[0];
    let (conn, layer) = handshake(suite, version).layer();
    let (mut server, mut peer) = connect(layer.with_key_limit(100), conn, Vec::new()).await;
    let upload = pattern(TOTAL, 3);
    let server_reads = async {
        let mut got = vec![0u8; TOTAL];
        server.read_exact(&mut got).await.unwrap();
        (server, got)
    };
    let client_sends = async {
        for quarter in upload.chunks(TOTAL / 4) {
            peer.conn.refresh_traffic_keys().unwrap();
            peer.send(quarter).await;
        }
        peer
    };
    let ((mut server, got), mut peer) = tokio::join!(server_reads, client_sends);
    assert!(got == upload, "the upload arrived intact");
    let download = pattern(TOTAL, 5);
    let server_writes = async {
        server.write_all(&download).await.unwrap();
        server.flush().await.unwrap();
        server
    };
    let (server, received) = tokio::join!(server_writes, peer.recv(TOTAL));
    assert!(received == download, "the download arrived intact");
    assert!(
        server.record_layer().tx_seq() < 100,
        "our keys changed on the way"
    );
    assert!(!server.holds_buffers());
}

#[tokio::test]
async fn a_64_kib_record_is_refused_with_record_overflow() {
    let (mut server, mut peer) = pair(0).await;
    peer.sock
        .write_all(&[23, 3, 3, 0xff, 0xff, 0, 0, 0])
        .await
        .unwrap();
    let err = server.read(&mut [0u8; 16]).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    let alert = peer.recv_raw().await;
    assert_eq!(
        peer.take(&alert),
        Err(rustls::Error::AlertReceived(
            AlertDescription::RecordOverflow
        ))
    );
    assert_eq!(
        server.read(&mut [0u8; 16]).await.unwrap_err().kind(),
        io::ErrorKind::InvalidData
    );
}

/// Between requests the stream holds keys and a socket: no buffer, and the thread's pool
/// has every buffer back.
#[tokio::test]
async fn an_idle_stream_holds_no_buffer() {
    let (mut server, mut peer) = pair(0).await;
    assert!(!server.holds_buffers());
    for _ in 0..3 {
        peer.send(&pattern(40_000, 7)).await;
        let mut request = vec![0u8; 40_000];
        server.read_exact(&mut request).await.unwrap();
        server.write_all(&pattern(50_000, 9)).await.unwrap();
        server.flush().await.unwrap();
        peer.recv(50_000).await;
        assert!(
            !server.holds_buffers(),
            "idle after a request and its response"
        );
        assert_eq!(pool::lent(), 0, "every buffer is back in the pool");
    }
    // The head of a record arriving keeps its buffer until the rest comes.
    peer.conn.writer().write_all(b"partial").unwrap();
    let mut record = Vec::new();
    peer.conn.write_tls(&mut record).unwrap();
    peer.sock.write_all(&record[..8]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!ready_now(&mut server));
    assert!(server.holds_buffers(), "a record on its way");
    peer.sock.write_all(&record[8..]).await.unwrap();
    let mut got = [0u8; 7];
    server.read_exact(&mut got).await.unwrap();
    assert!(!server.holds_buffers());
}

#[tokio::test]
async fn shutdown_sends_close_notify() {
    let (mut server, mut peer) = pair(3).await;
    server.write_all(b"last words").await.unwrap();
    server.shutdown().await.unwrap();
    let mut raw = Vec::new();
    loop {
        let more = peer.recv_raw().await;
        if more.is_empty() {
            break;
        }
        raw.extend(more);
    }
    assert_eq!(peer.take(&raw).unwrap(), b"last words");
    assert_eq!(
        peer.conn.reader().read(&mut [0u8; 1]).unwrap(),
        0,
        "close_notify came"
    );
}
