//! A client of a running terminus's admin listener, for the commands that read it
//! (`terminus capacity --admin`, `terminus top`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Why the admin listener's page could not be had.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// `--admin` is not an IP:PORT.
    #[error("--admin {addr:?}: give the admin listener as IP:PORT")]
    Address {
        /// `--admin` as given.
        addr: String,
    },
    /// The connection failed (or timed out).
    #[error("admin listener {addr}: {source}")]
    Io {
        /// The listener.
        addr: String,
        /// What the connection said.
        #[source]
        source: std::io::Error,
    },
    /// What came back is not HTTP.
    #[error("admin listener {addr}: not an HTTP response")]
    NotHttp {
        /// The listener.
        addr: String,
    },
    /// The answer is not a 200.
    #[error(
        "admin listener {addr}: GET {path} answered {status:?}: is this terminus's admin listener?"
    )]
    Status {
        /// The listener.
        addr: String,
        /// The page asked for.
        path: String,
        /// The answer's status line.
        status: String,
    },
    /// The page is not the JSON it should be.
    #[error("admin listener {addr}: {path} is not JSON: {source}")]
    NotJson {
        /// The listener.
        addr: String,
        /// The page.
        path: String,
        /// What the parser said.
        #[source]
        source: serde_json::Error,
    },
}

/// `GET path` from the admin listener at `addr`: the body of a 200 answer.
pub fn get(addr: &str, path: &str) -> Result<String, AdminError> {
    let sockaddr: SocketAddr = addr.parse().map_err(|_| AdminError::Address {
        addr: addr.to_owned(),
    })?;
    let failed = |source| AdminError::Io {
        addr: addr.to_owned(),
        source,
    };
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
        .ok_or_else(|| AdminError::NotHttp {
            addr: addr.to_owned(),
        })?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(AdminError::Status {
            addr: addr.to_owned(),
            path: path.to_owned(),
            status: head.lines().next().unwrap_or("").to_owned(),
        });
    }
    Ok(body.to_owned())
}

/// `GET path` from the admin listener at `addr`, as JSON.
pub fn get_json(addr: &str, path: &str) -> Result<serde_json::Value, AdminError> {
    let body = get(addr, path)?;
    serde_json::from_str(&body).map_err(|source| AdminError::NotJson {
        addr: addr.to_owned(),
        path: path.to_owned(),
        source,
    })
}
