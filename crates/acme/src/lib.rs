//! Certificates without hands: ACME (RFC 8555) issuance and renewal for the servers that
//! say `certificates = "acme"`, with ACME Renewal Information (ARI, RFC 9773).
//!
//! The protocol is instant-acme's (JWS, nonces and their retries, orders, ARI); terminus
//! owns the rest, each in a module of its own:
//!
//! - [`settings`]: the issuer as the configuration names it (directory, contact, EAB, a
//!   private CA's root, profile, state directory, challenge type).
//! - [`challenges`]: the answers the listeners give while an order waits on them:
//!   HTTP-01 key authorizations for the plain-HTTP listener, TLS-ALPN-01 certificates for
//!   the TLS listener (RFC 8737).
//! - [`schedule`]: when to renew (ARI's window first, else at 2/3 of the lifetime) and
//!   how to back off after a failure: policy, without I/O.
//! - [`store`]: the state directory: the account and every certificate with its key,
//!   written atomically, mode 0600.
//! - `fleet`: with `[fleet]`, the account and certificates kept in the fleet's store,
//!   one instance ordering each under a lock, and challenge answers shared, so that the
//!   CA's validation may reach any instance.
//! - `http`: the client that reaches the CA, keeping a 429's or 503's Retry-After, and
//!   `terminus check`'s look at the directory.
//! - `issuer`: one order from new-order to the certificate chain.
//! - [`Acme`]: the thread that keeps every server's certificates issued and renewed, and
//!   tells the server when one changed (it goes live by the reload path).

pub mod challenges;
mod fleet;
mod http;
mod issuer;
mod manager;
mod metrics;
pub mod schedule;
pub mod settings;
pub mod store;

pub use challenges::{ChallengeError, Challenges};
pub use http::{check_issuer, CaError, IssuerProblem};
pub use manager::{Acme, AcmeError, OnIssued, Target};
pub use metrics::AcmeMetrics;
pub use settings::{AcmeSettings, ChallengeKind, Eab};
pub use store::{CertKind, StateDir};
