//! A client of a running terminus's admin listener, for the commands that read it
//! (`terminus capacity --admin`, `terminus top`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// `GET path` from the admin listener at `addr`: the body of a 200 answer.
pub fn get(addr: &str, path: &str) -> Result<String, String> {
    let sockaddr: SocketAddr = addr
        .parse()
        .map_err(|_| format!("--admin {addr:?}: give the admin listener as IP:PORT"))?;
    let failed = |e: std::io::Error| format!("admin listener {addr}: {e}");
    let mut stream =
        TcpStream::connect_timeout(&sockaddr, Duration::from_secs(5)).map_err(failed)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(failed)?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(failed)?;
    let mut response = String::new();
    stream.read_to_string(&mut response).map_err(failed)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("admin listener {addr}: not an HTTP response"))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        let status = head.lines().next().unwrap_or("");
        return Err(format!(
            "admin listener {addr}: GET {path} answered {status:?}: is this terminus's admin listener?"
        ));
    }
    Ok(body.to_owned())
}
