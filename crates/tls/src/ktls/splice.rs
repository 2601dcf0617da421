//! splice(2) between a kernel TLS client socket and a plain TCP upstream: the primitive
//! the reverse proxy moves bodies with. Bytes go socket -> pipe -> socket inside the
//! kernel, which decrypts what it splices out of the client and encrypts what it splices
//! into it; nothing is copied through user space. Between two plain sockets (TLS passed
//! through untouched) the same relay needs no kernel TLS at all.

use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;

use super::stream::{classify, ControlRecord};
use super::sys;
use super::KtlsStream;
use crate::activity::Activity;
use crate::stream::SendMethod;

/// Bytes moved per splice call.
const STEP: usize = 64 * 1024;

/// Relays both directions until each has reached its end (close_notify or FIN from the
/// client, FIN from the upstream), passing each end on (FIN to the upstream; close_notify
/// and FIN to the client), or until nothing has moved either way for `idle`. Returns the
/// bytes moved (client to upstream, upstream to client), counted even when the relay
/// ended with an error, and how it ended. What the client sent with its last handshake
/// flight was decrypted by rustls, not the kernel: it goes to the upstream first, by write.
pub async fn splice_bidirectional(
    client: &mut KtlsStream,
    upstream: &TcpStream,
    idle: Duration,
) -> (u64, u64, io::Result<()>) {
    let moved = Activity::default();
    let (early, client_done) = client.take_early();
    let socket = client.socket();
    let up = async {
        if !early.is_empty() {
            write_all(upstream, &early).await?;
            moved.up(early.len());
        }
        if !client_done {
            pump(socket, upstream, &|n| moved.up(n), true).await?;
        }
        sys::shutdown_write(upstream.as_raw_fd())
    };
    let moved_down = |n| moved.down(n);
    let down = pump(upstream, socket, &moved_down, false);
    let (ended, calls) = match moved
        .until_quiet(async { tokio::try_join!(up, down) }, idle)
        .await
    {
        Ok(((), calls)) => (Ok(()), calls),
        Err(e) => (Err(e), 0),
    };
    let (up, down) = moved.moved();
    client.charge(SendMethod::Splice, down, calls);
    let ended = match ended {
        Ok(()) => {
            use tokio::io::AsyncWriteExt;
            client.shutdown().await
        }
        Err(e) => Err(e),
    };
    (up, down, ended)
}

/// Relays both directions between two plain TCP sockets until each has ended, passing
/// each FIN on, or until nothing has moved for `idle`. Returns the bytes moved (`a` to
/// `b`, `b` to `a`), counted even when the relay ended with an error, and how it ended.
pub async fn splice_plain(
    a: &TcpStream,
    b: &TcpStream,
    idle: Duration,
) -> (u64, u64, io::Result<()>) {
    let moved = Activity::default();
    let forward = async {
        pump(a, b, &|n| moved.up(n), false).await?;
        sys::shutdown_write(b.as_raw_fd())
    };
    let back = async {
        pump(b, a, &|n| moved.down(n), false).await?;
        sys::shutdown_write(a.as_raw_fd())
    };
    let ended = moved
        .until_quiet(async { tokio::try_join!(forward, back) }, idle)
        .await;
    let (up, down) = moved.moved();
    (up, down, ended.map(|_| ()))
}

/// Moves `from` to `to` through a pipe of its own until `from` ends, telling `moved` each
/// step's bytes; returns the writes into `to` it took.
/// `from_ktls`: `from` is the kernel TLS socket, where splice stops with EINVAL at a
/// record that is not data.
///
/// Each splice waits for its socket's readiness and nothing else. A kernel TLS socket
/// whose send queue filled (splice: EAGAIN) is reported writable only once a third of its
/// send buffer is free again (`sk_stream_min_wspace`), though it would take a few KiB
/// before that: the relay waits for the report, like any epoll program.
async fn pump(
    from: &TcpStream,
    to: &TcpStream,
    moved: &dyn Fn(usize),
    from_ktls: bool,
) -> io::Result<u64> {
    let pipe = sys::pipe()?;
    let (pipe_out, pipe_in) = (pipe.0.as_raw_fd(), pipe.1.as_raw_fd());
    let mut writes = 0u64;
    loop {
        let spliced = from
            .async_io(Interest::READABLE, || {
                sys::splice(from.as_raw_fd(), pipe_in, STEP)
            })
            .await;
        let n = match spliced {
            Ok(0) => return Ok(writes),
            Ok(n) => n,
            Err(e) if from_ktls && e.raw_os_error() == Some(libc::EINVAL) => {
                match read_control_record(from)? {
                    None => continue,
                    Some((ControlRecord::Data, data)) if data.is_empty() => return Ok(writes),
                    Some((ControlRecord::Data, data)) => {
                        write_all(to, &data).await?;
                        moved(data.len());
                        writes += 1;
                        continue;
                    }
                    Some((ControlRecord::CloseNotify, _)) => return Ok(writes),
                    Some((other, _)) => return Err(other.into_error()),
                }
            }
            Err(e) => return Err(e),
        };
        let mut left = n;
        while left > 0 {
            let m = to
                .async_io(Interest::WRITABLE, || {
                    sys::splice(pipe_out, to.as_raw_fd(), left)
                })
                .await?;
            left -= m;
            writes += 1;
            moved(m);
        }
    }
}

async fn write_all(to: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        to.writable().await?;
        match to.try_write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads the record splice stopped at with its type (data too, should it be data after
/// all). None: it was not ready.
fn read_control_record(socket: &TcpStream) -> io::Result<Option<(ControlRecord, Vec<u8>)>> {
    let mut body = vec![0u8; 16 * 1024];
    // Called right after splice said a record other than data is at the head, so the
    // record is there to read: no readiness to wait for.
    match sys::recv_record(socket.as_raw_fd(), &mut body) {
        Ok((n, record_type)) => {
            body.truncate(n);
            Ok(Some((classify(record_type, &body), body)))
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}
