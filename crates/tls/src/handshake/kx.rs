//! Key-exchange groups whose key generation and shared secrets come from the engine.

use rustls::crypto::{ActiveKeyExchange, CompletedKeyExchange, SharedSecret, SupportedKxGroup};
use rustls::NamedGroup;
use terminus_engine::{CryptoOp, CryptoOutput, KxGroup, KxPrivateKey};

use super::bridge;
use super::error::{to_rustls, wrong_output};

/// A rustls [`SupportedKxGroup`] backed by the crypto engine.
#[derive(Debug)]
pub struct EngineKxGroup(KxGroup);

static X25519: EngineKxGroup = EngineKxGroup(KxGroup::X25519);
static SECP256R1: EngineKxGroup = EngineKxGroup(KxGroup::Secp256r1);
static SECP384R1: EngineKxGroup = EngineKxGroup(KxGroup::Secp384r1);

impl EngineKxGroup {
    /// The engine-backed group for `group`.
    pub fn for_group(group: KxGroup) -> &'static Self {
        match group {
            KxGroup::X25519 => &X25519,
            KxGroup::Secp256r1 => &SECP256R1,
            KxGroup::Secp384r1 => &SECP384R1,
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
}

struct EngineActiveKx {
    group: KxGroup,
    private_key: KxPrivateKey,
    public: Vec<u8>,
}

impl ActiveKeyExchange for EngineActiveKx {
    fn complete(self: Box<Self>, peer_pub_key: &[u8]) -> Result<SharedSecret, rustls::Error> {
        let op = CryptoOp::KxAgree {
            group: self.group,
            private_key: self.private_key,
            peer_public: peer_pub_key.to_vec(),
        };
        match bridge::call(op).map_err(to_rustls)? {
            CryptoOutput::Shared(shared) => Ok(SharedSecret::from(&shared[..])),
            other => Err(wrong_output(self.group.op_kind(), &other)),
        }
    }

    fn pub_key(&self) -> &[u8] {
        &self.public
    }

    fn group(&self) -> NamedGroup {
        self.group.named_group()
    }
}
