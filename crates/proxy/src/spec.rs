//! What an upstream is, as configured: its servers and how requests are spread over
//! them, how long each step may take, and when a server is taken out. The server's
//! configuration resolves `[[upstream]]` into these (with file and line for every error);
//! this crate reads no file but the CA file a TLS upstream names.

use std::net::SocketAddr;
use std::time::Duration;

/// One `[[upstream]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamSpec {
    /// The name routes refer to it by, and metrics and logs name it with.
    pub name: String,
    /// Primary servers first, in the order written, then backups.
    pub servers: Vec<ServerSpec>,
    /// How a request's server is chosen.
    pub balance: Balance,
    /// What the servers speak.
    pub protocol: Protocol,
    /// Idle connections kept for reuse.
    pub keepalive: Keepalive,
    /// How long each step may take.
    pub timeouts: Timeouts,
    /// When a server is taken out of rotation.
    pub health: Health,
    /// A PROXY protocol header at the start of each connection to a server (HTTP/1.1
    /// upstreams; a connection then carries only its client's requests).
    pub proxy_protocol: Option<crate::proxy_protocol::Version>,
    /// TLS to the servers (`tls = { ... }`), when configured.
    pub tls: Option<crate::connect::UpstreamTls>,
    /// The `Upgrade` tokens (lower case) a client may switch to through this upstream:
    /// `websocket` and what the configuration adds. Any other is taken out of the request.
    pub upgrades: Vec<String>,
    /// How a client's verified certificate is told to the servers.
    pub client_cert: ClientCertHeader,
    /// Requests whose method is not idempotent may also be sent again after a server may
    /// have seen them (nginx `proxy_next_upstream non_idempotent`; off by default). What
    /// the client sends never decides it: a client's `Idempotency-Key` is a promise
    /// about the application that only its operator can make.
    pub retry_non_idempotent: bool,
}

/// The fields that carry a client's certificate (mutual TLS) to the servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientCertHeader {
    /// RFC 9440: `Client-Cert` (the leaf, `:base64 DER:`) and `Client-Cert-Chain`.
    #[default]
    Rfc9440,
    /// Envoy's `X-Forwarded-Client-Cert` (`Hash=...;Subject="...";URI=...;DNS=...`).
    Xfcc,
}

/// One server of an upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    /// Where it listens.
    pub address: SocketAddr,
    /// The host name it was written with, if it was not an address (the default TLS
    /// server name, as nginx's `proxy_ssl_name`).
    pub host: Option<String>,
    /// Its share of requests relative to the others (round robin and hash).
    pub weight: u32,
    /// Used only while every primary server is down.
    pub backup: bool,
}

/// What an upstream's servers speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1, a connection per request in progress, kept alive between them (over
    /// TLS when the upstream has `tls`).
    Http1,
    /// HTTP/2 over TLS, chosen by ALPN: one connection per server per worker, every
    /// request a stream on it.
    H2,
    /// HTTP/2 in cleartext with prior knowledge (gRPC backends): one connection per
    /// server per worker, every request a stream on it.
    H2c,
}

/// How the next request's server is chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Balance {
    /// In turn, each server `weight` times per round, interleaved (nginx's smooth
    /// weighted round robin).
    RoundRobin,
    /// The server with the fewest requests in progress relative to its weight.
    LeastConn,
    /// The same key goes to the same server while it is up.
    Hash(HashKey),
}

/// What a hash balance hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKey {
    /// The client's IP address (nginx `ip_hash`).
    ClientIp,
    /// The request's path and query.
    Uri,
    /// A request header, lower case; requests without it are spread in turn.
    Header(String),
}

/// Idle upstream connections kept for reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// At most this many idle connections per server per worker (0: no reuse).
    pub idle: usize,
    /// An idle connection is closed after this long unused.
    pub timeout: Duration,
}

/// How long each step of a proxied request may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Establishing the TCP connection.
    pub connect: Duration,
    /// From the end of the request to the response's head.
    pub response_header: Duration,
    /// Between two reads or two writes of a body, either way.
    pub idle: Duration,
}

/// When a server is taken out of rotation and brought back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// Failures in a row (errors, timeouts, bad responses) that take a server out.
    pub fails: u32,
    /// How long a server that failed stays out before it is tried again, and how often
    /// active checks run.
    pub interval: Duration,
    /// Active checks, when configured.
    pub check: Option<Check>,
}

/// An active health check: `GET path` to every server each `interval`; a 2xx or 3xx
/// within `timeout` passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// The path asked for.
    pub path: String,
    /// How long a probe may take.
    pub timeout: Duration,
    /// Passes in a row that bring a server back.
    pub passes: u32,
}

impl Default for Keepalive {
    fn default() -> Self {
        Keepalive {
            idle: 32,
            timeout: Duration::from_secs(60),
        }
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(5),
            response_header: Duration::from_secs(60),
            idle: Duration::from_secs(60),
        }
    }
}

impl Default for Health {
    fn default() -> Self {
        Health {
            fails: 1,
            interval: Duration::from_secs(10),
            check: None,
        }
    }
}
