//! The QUIC side of a TLS configuration: the site's rustls configuration (its engine
//! signing keys and key-exchange groups, so QUIC handshakes are computed by the crypto
//! engine as TCP ones are) with HTTP/3's ALPN, wrapped for quinn-proto.

use std::sync::Arc;
use std::time::Duration;

use quinn_proto::crypto::rustls::QuicServerConfig;
use quinn_proto::{IdleTimeout, ServerConfig, TransportConfig, VarInt};
use rustls::server::ServerSessionMemoryCache;
use terminus_tls::config::NoTickets;

/// Why a TLS configuration cannot serve QUIC.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// No TLS 1.3 suite QUIC's Initial packets can be protected with.
    #[error("TLS settings QUIC cannot use: {0}")]
    Tls(#[from] quinn_proto::crypto::rustls::NoInitialCipherSuite),
}

/// HTTP/3's ALPN protocol (RFC 9114 section 3.1).
pub const H3_ALPN: &[u8] = b"h3";

/// How long a QUIC connection may stay silent before it is closed: quic-go's default,
/// which Caddy serves with.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A quinn-proto server configuration from `tls`: HTTP/3 only, TLS 1.3 as QUIC requires.
/// 0-RTT only with `early_data`, the entries of the session cache it needs.
///
/// rustls takes early data only on a session resumed from its cache (never on a
/// stateless ticket, which could be offered again), and takes each session once
/// (RFC 8446 section 8.1's single-use tickets): a ClientHello replayed finds its session
/// gone, gets a full handshake and has its early data refused. So with 0-RTT on, QUIC
/// issues no stateless tickets and keeps a cache of its own, one for every worker (one
/// configuration), so that a replay reaching another worker is refused too.
pub fn server_config(
    tls: &Arc<rustls::ServerConfig>,
    early_data: Option<usize>,
) -> Result<Arc<ServerConfig>, ConfigError> {
    let mut tls = (**tls).clone();
    tls.alpn_protocols = vec![H3_ALPN.to_vec()];
    match early_data {
        None => tls.max_early_data_size = 0,
        Some(sessions) => {
            // QUIC's value (RFC 9001 section 4.6.1): the stream limits bound 0-RTT data.
            tls.max_early_data_size = u32::MAX;
            tls.ticketer = Arc::new(NoTickets);
            tls.session_storage = ServerSessionMemoryCache::new(sessions.max(1));
        }
    }
    // QUIC carries no kernel-TLS hand-off.
    tls.enable_secret_extraction = false;
    let crypto = QuicServerConfig::try_from(Arc::new(tls))?;
    let mut transport = TransportConfig::default();
    transport.max_idle_timeout(Some(
        IdleTimeout::try_from(IDLE_TIMEOUT).expect("30 s is a valid idle timeout"),
    ));
    // HTTP/3 opens a few unidirectional streams each way (control, QPACK encoder and
    // decoder) and a bidirectional one per request.
    transport.max_concurrent_uni_streams(VarInt::from_u32(8));
    transport.max_concurrent_bidi_streams(VarInt::from_u32(100));
    // What one connection may make the server hold: quinn's defaults let a connection
    // buffer up to its whole receive window unread.
    transport.stream_receive_window(VarInt::from_u32(1 << 20));
    transport.receive_window(VarInt::from_u32(8 << 20));
    transport.send_window(8 << 20);
    // No QUIC DATAGRAM frames: HTTP/3 datagrams are not served, and quinn would buffer
    // them.
    transport.datagram_receive_buffer_size(None);
    let mut config = ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    Ok(Arc::new(config))
}
