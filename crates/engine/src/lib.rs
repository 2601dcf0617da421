//! The per-worker crypto engine.
//!
//! Handshakes do not compute their own private-key and key-exchange operations: they hand a
//! [`CryptoOp`] to the [`Engine`] of the worker they run on and are resumed with the result.
//! The engine keeps one queue per [`OpKind`], decides when a queue is flushed
//! ([`FlushPolicy`]) and gives the flushed batch to a [`Backend`]:
//!
//! - [`ScalarBackend`] computes each operation on the worker with aws-lc-rs, as nginx does;
//! - [`ThreadPoolBackend`] sends operations to a small pool of crypto threads through a bounded
//!   queue and receives completions asynchronously, the shape of an offload device.
//!
//! - [`MultibufferBackend`] batches up to 8 operations into one crypto_mb (AVX-512 IFMA)
//!   call, computing batches below the crossover scalar.
//!
//! A signature with a key held by a keyless signer elsewhere ([`RemoteKey`]) is not
//! queued: it goes to the key's client at once, and the signer batches.
//!
//! Each request comes with its handshake's [`HandshakeContext`]: the [`Payer`] it is
//! charged to (a tenant, whose quota `terminus-admission` keeps) and the [`Timeline`] the
//! engine records its queueing and batching in.

mod backend;
pub mod busy;
pub mod context;
pub mod cost;
mod engine;
mod fair;
mod hybrid;
mod idle;
mod metrics;
// The FFI boundary: crypto_mb's 8-lane calls.
#[allow(unsafe_code)]
pub mod multibuffer;
mod op;
mod payer;
mod remote;
pub mod scalar;
mod signing_key;
mod threads;

pub use backend::{Backend, BackendKind, EngineSpec, FallbackCause, Job, Reply};
pub use context::{HandshakeContext, Timeline};
pub use engine::{Engine, FlushPolicy, HandshakeGuard};
pub use idle::{parked_time, worker_awake, worker_idle};
pub use metrics::EngineMetrics;
pub use multibuffer::MultibufferBackend;
pub use op::{
    CryptoError, CryptoOp, CryptoOutput, HybridPrivateKey, KxGroup, KxPrivateKey, OpKind,
};
pub use payer::Payer;
pub use remote::{Handshake as RemoteHandshake, RemoteKey};
pub use scalar::{warm_up_csprng, ScalarBackend};
pub use signing_key::{scheme_digest, BatchKey, KeyAlgorithm, KeyError, SigningKeyPair};
pub use threads::{ThreadPool, ThreadPoolBackend};
