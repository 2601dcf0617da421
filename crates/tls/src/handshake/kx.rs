//! Key-exchange groups whose key generation and shared secrets come from the engine,
//! the post-quantum hybrid included (its KEM part is the engine's too: no exchange is
//! computed outside its queues and metrics).

use rustls::crypto::{ActiveKeyExchange, CompletedKeyExchange, SharedSecret, SupportedKxGroup};
use rustls::{NamedGroup, ProtocolVersion};
use terminus_engine::{CryptoOp, CryptoOutput, KxGroup, KxPrivateKey};

use super::bridge;
use super::error::{to_rustls, wrong_output};

/// A rustls [`SupportedKxGroup`] backed by the crypto engine.
#[derive(Debug)]
pub struct EngineKxGroup(KxGroup);

static X25519: EngineKxGroup = EngineKxGroup(KxGroup::X25519);
static SECP256R1: EngineKxGroup = EngineKxGroup(KxGroup::Secp256r1);
static SECP384R1: EngineKxGroup = EngineKxGroup(KxGroup::Secp384r1);
static X25519MLKEM768: EngineKxGroup = EngineKxGroup(KxGroup::X25519MlKem768);

impl EngineKxGroup {
    /// The engine-backed group for `group`.
    pub fn for_group(group: KxGroup) -> &'static Self {
        match group {
            KxGroup::X25519 => &X25519,
            KxGroup::Secp256r1 => &SECP256R1,
            KxGroup::Secp384r1 => &SECP384R1,
            KxGroup::X25519MlKem768 => &X25519MLKEM768,
        }
    }
}

impl SupportedKxGroup for EngineKxGroup {
    fn start(&self) -> Result<Box<dyn ActiveKeyExchange>, rustls::Error> {
        match bridge::call(CryptoOp::KxGenerate { group: self.0 }).map_err(to_rustls)? {
            CryptoOutput::KeyPair {
                private_key,
                public,
            } => Ok(Box::new(EngineActiveKx {
                group: self.0,
                private_key,
                public,
            })),
            other => Err(wrong_output(self.0.op_kind(), &other)),
        }
    }

    /// TLS 1.3 servers generate and complete in one step: one engine request, not two.
    fn start_and_complete(
        &self,
        peer_pub_key: &[u8],
    ) -> Result<CompletedKeyExchange, rustls::Error> {
        let op = CryptoOp::KxGenerateAgree {
            group: self.0,
            peer_public: peer_pub_key.to_vec(),
        };
        match bridge::call(op).map_err(to_rustls)? {
            CryptoOutput::PublicAndShared { public, shared } => Ok(CompletedKeyExchange {
                group: self.0.named_group(),
                pub_key: public,
                secret: SharedSecret::from(&shared[..]),
            }),
            other => Err(wrong_output(self.0.op_kind(), &other)),
        }
    }

    fn name(&self) -> NamedGroup {
        self.0.named_group()
    }

    fn usable_for_version(&self, version: ProtocolVersion) -> bool {
        version == ProtocolVersion::TLSv1_3 || self.0.tls12()
    }
}

struct EngineActiveKx {
    group: KxGroup,
    private_key: KxPrivateKey,
    public: Vec<u8>,
}

impl ActiveKeyExchange for EngineActiveKx {
    fn complete(self: Box<Self>, peer_pub_key: &[u8]) -> Result<SharedSecret, rustls::Error> {
        agree(self.group, self.private_key, peer_pub_key)
    }

    fn pub_key(&self) -> &[u8] {
        &self.public
    }

    fn group(&self) -> NamedGroup {
        self.group.named_group()
    }

    /// A client's hybrid share carries an X25519 share, which rustls then also offers on
    /// its own (one key pair, two offers), as its aws-lc hybrid does.
    fn hybrid_component(&self) -> Option<(NamedGroup, &[u8])> {
        let classical = self.group.classical();
        (classical != self.group).then(|| {
            let len = self.public.len() - CLASSICAL_SHARE_LEN;
            (classical.named_group(), &self.public[len..])
        })
    }

    /// The server chose the classical half offered on its own.
    fn complete_hybrid_component(
        self: Box<Self>,
        peer_pub_key: &[u8],
    ) -> Result<SharedSecret, rustls::Error> {
        agree(
            self.group.classical(),
            self.private_key.into_classical(),
            peer_pub_key,
        )
    }
}

/// Completes an exchange of `group` through the engine.
fn agree(
    group: KxGroup,
    private_key: KxPrivateKey,
    peer_public: &[u8],
) -> Result<SharedSecret, rustls::Error> {
    let op = CryptoOp::KxAgree {
        group,
        private_key,
        peer_public: peer_public.to_vec(),
    };
    match bridge::call(op).map_err(to_rustls)? {
        CryptoOutput::Shared(shared) => Ok(SharedSecret::from(&shared[..])),
        other => Err(wrong_output(group.op_kind(), &other)),
    }
}

/// The X25519 share that ends a hybrid share (draft-ietf-tls-ecdhe-mlkem puts ML-KEM's
/// part first).
const CLASSICAL_SHARE_LEN: usize = 32;
