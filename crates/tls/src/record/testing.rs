//! Test support: a handshake between rustls's buffered client and its unbuffered server,
//! in memory, ending where terminus's record layer takes over.

use std::sync::Arc;

use rustls::client::ClientConnection;
use rustls::crypto::aws_lc_rs::cipher_suite as suites;
use rustls::kernel::KernelConnection;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError};
use rustls::{ExtractedSecrets, SupportedCipherSuite, SupportedProtocolVersion};

use super::RecordLayer;

/// Every suite terminus's record layer seals, with its protocol version.
pub(crate) fn all_suites() -> Vec<(SupportedCipherSuite, &'static SupportedProtocolVersion)> {
    let v12 = &rustls::version::TLS12;
    let v13 = &rustls::version::TLS13;
    vec![
        (suites::TLS13_AES_128_GCM_SHA256, v13),
        (suites::TLS13_AES_256_GCM_SHA384, v13),
        (suites::TLS13_CHACHA20_POLY1305_SHA256, v13),
        (suites::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, v12),
        (suites::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, v12),
        (suites::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, v12),
    ]
}

/// What the lead's handshake driver ends with, and the client that shook hands.
pub(crate) struct Handshaken {
    pub client: ClientConnection,
    pub secrets: ExtractedSecrets,
    pub kernel: KernelConnection<ServerConnectionData>,
}

impl Handshaken {
    /// The server's record layer.
    pub fn layer(self) -> (ClientConnection, RecordLayer<ServerConnectionData>) {
        let layer = RecordLayer::new(self.secrets, self.kernel).expect("a usable layer");
        (self.client, layer)
    }
}

/// A full handshake with `suite`, in memory.
pub(crate) fn handshake(
    suite: SupportedCipherSuite,
    version: &'static SupportedProtocolVersion,
) -> Handshaken {
    let (server_config, client_config) = configs(suite, version);
    let mut server = UnbufferedServerConnection::new(Arc::new(server_config)).unwrap();
    let mut client =
        ClientConnection::new(Arc::new(client_config), "localhost".try_into().unwrap()).unwrap();
    let mut incoming = Vec::new();
    loop {
        client.write_tls(&mut incoming).unwrap();
        if step(&mut server, &mut client, &mut incoming) {
            break;
        }
    }
    assert!(
        incoming.is_empty(),
        "the client sent nothing after its Finished"
    );
    let (secrets, kernel) = server.dangerous_into_kernel_connection().unwrap();
    Handshaken {
        client,
        secrets,
        kernel,
    }
}

/// Drives the server over what the client sent; true once the handshake is over.
fn step(
    server: &mut UnbufferedServerConnection,
    client: &mut ClientConnection,
    incoming: &mut Vec<u8>,
) -> bool {
    let mut outgoing = Vec::new();
    loop {
        let handshaking = server.is_handshaking();
        let status = server.process_tls_records(incoming);
        let discard = status.discard;
        let mut done = false;
        let mut blocked = false;
        match status.state.expect("the server's handshake") {
            ConnectionState::EncodeTlsData(mut encode) => encode_into(&mut encode, &mut outgoing),
            ConnectionState::TransmitTlsData(transmit) => {
                client.read_tls(&mut &outgoing[..]).unwrap();
                client.process_new_packets().unwrap();
                outgoing.clear();
                transmit.done();
            }
            ConnectionState::BlockedHandshake => blocked = true,
            ConnectionState::WriteTraffic(_) if handshaking => blocked = true,
            ConnectionState::WriteTraffic(_) => done = true,
            other => panic!("unexpected state {other:?}"),
        }
        incoming.drain(..discard);
        if done || blocked {
            return done;
        }
    }
}

fn encode_into(
    encode: &mut rustls::unbuffered::EncodeTlsData<'_, ServerConnectionData>,
    outgoing: &mut Vec<u8>,
) {
    let at = outgoing.len();
    outgoing.resize(at + 16 * 1024, 0);
    let n = match encode.encode(&mut outgoing[at..]) {
        Ok(n) => n,
        Err(EncodeError::InsufficientSize(size)) => {
            outgoing.resize(at + size.required_size, 0);
            encode.encode(&mut outgoing[at..]).unwrap()
        }
        Err(e) => panic!("{e}"),
    };
    outgoing.truncate(at + n);
}

fn configs(
    suite: SupportedCipherSuite,
    version: &'static SupportedProtocolVersion,
) -> (rustls::ServerConfig, rustls::ClientConfig) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.cipher_suites = vec![suite];
    let provider = Arc::new(provider);
    let mut server_config = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[version])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into()),
        )
        .unwrap();
    server_config.enable_secret_extraction = true;
    let client_config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[version])
        .unwrap()
        .dangerous()
        // Chain and name unchecked: the tests are about records, not trust.
        .with_custom_certificate_verifier(
            crate::client::Trust::Insecure.verifier(&provider).unwrap(),
        )
        .with_no_client_auth();
    (server_config, client_config)
}
