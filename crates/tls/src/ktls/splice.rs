//! splice(2) between a kernel TLS client socket and a plain TCP upstream: the primitive
//! the reverse proxy moves bodies with. Bytes go socket -> pipe -> socket inside the
//! kernel, which decrypts what it splices out of the client and encrypts what it splices
//! into it; nothing is copied through user space. Between two plain sockets (TLS passed
//! through untouched) the same relay needs no kernel TLS at all.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use tokio::io::Interest;
use tokio::net::TcpStream;

use super::stream::{classify, ControlRecord};
use super::sys;
use super::KtlsStream;
use crate::stream::SendMethod;

/// Bytes moved per splice call: a pipe holds 16 pages by default.
const STEP: usize = 64 * 1024;

/// Relays both directions until each has reached its end (close_notify or FIN from the
/// client, FIN from the upstream), passing each end on (FIN to the upstream; close_notify
/// and FIN to the client). Returns the bytes moved (client to upstream, upstream to client).
pub async fn splice_bidirectional(
    client: &mut KtlsStream,
    upstream: &TcpStream,
) -> io::Result<(u64, u64)> {
    let to_upstream = sys::pipe()?;
    let to_client = sys::pipe()?;
    let socket = client.socket();
    let up = async {
        let (n, _) = pump(socket, upstream, &to_upstream, true).await?;
        sys::shutdown_write(upstream.as_raw_fd())?;
        Ok::<_, io::Error>(n)
    };
    let down = pump(upstream, socket, &to_client, false);
    let (up, (down, calls)) = tokio::try_join!(up, down)?;
    client.charge(SendMethod::Splice, down, calls);
    use tokio::io::AsyncWriteExt;
    client.shutdown().await?;
    Ok((up, down))
}

/// Relays both directions between two plain TCP sockets until each has ended, passing
/// each FIN on. Returns the bytes moved (`a` to `b`, `b` to `a`).
pub async fn splice_plain(a: &TcpStream, b: &TcpStream) -> io::Result<(u64, u64)> {
    let (a_to_b, b_to_a) = (sys::pipe()?, sys::pipe()?);
    let forward = async {
        let (n, _) = pump(a, b, &a_to_b, false).await?;
        sys::shutdown_write(b.as_raw_fd())?;
        Ok::<_, io::Error>(n)
    };
    let back = async {
        let (n, _) = pump(b, a, &b_to_a, false).await?;
        sys::shutdown_write(a.as_raw_fd())?;
        Ok::<_, io::Error>(n)
    };
    tokio::try_join!(forward, back)
}

/// Moves `from` to `to` through `pipe` until `from` ends; returns the bytes moved and the
/// writes into `to` it took. `from_ktls`: `from` is the kernel TLS socket, where splice
/// stops with EINVAL at a record that is not data.
async fn pump(
    from: &TcpStream,
    to: &TcpStream,
    pipe: &(OwnedFd, OwnedFd),
    from_ktls: bool,
) -> io::Result<(u64, u64)> {
    let (pipe_out, pipe_in) = (pipe.0.as_raw_fd(), pipe.1.as_raw_fd());
    let (mut total, mut writes) = (0u64, 0u64);
    loop {
        from.readable().await?;
        let n = match from.try_io(Interest::READABLE, || {
            sys::splice(from.as_raw_fd(), pipe_in, STEP)
        }) {
            Ok(0) => return Ok((total, writes)),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if from_ktls && e.raw_os_error() == Some(libc::EINVAL) => {
                match read_control_record(from)? {
                    None => continue,
                    Some((ControlRecord::Data, data)) if data.is_empty() => {
                        return Ok((total, writes))
                    }
                    Some((ControlRecord::Data, data)) => {
                        write_all(to, &data).await?;
                        total += data.len() as u64;
                        writes += 1;
                        continue;
                    }
                    Some((ControlRecord::CloseNotify, _)) => return Ok((total, writes)),
                    Some((other, _)) => return Err(other.into_error()),
                }
            }
            Err(e) => return Err(e),
        };
        let mut left = n;
        while left > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || {
                sys::splice(pipe_out, to.as_raw_fd(), left)
            }) {
                Ok(m) => {
                    left -= m;
                    writes += 1;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        total += n as u64;
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
    match socket.try_io(Interest::READABLE, || {
        sys::recv_record(socket.as_raw_fd(), &mut body)
    }) {
        Ok((n, record_type)) => {
            body.truncate(n);
            Ok(Some((classify(record_type, &body), body)))
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}
