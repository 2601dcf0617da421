//! Who gets in, and who may use how much of the machine's crypto: admission control and
//! tenants' quotas. This is policy, without I/O; the server asks it at accept and at the
//! ClientHello, and the crypto engine (`terminus-engine`) keeps the mechanism: what each
//! operation costs here, fair queueing by the weights it is given and charging what it
//! computed, through the [`terminus_engine::Payer`] a handshake carries (here, a tenant's
//! [`tenant::Hold`]).
//!
//! - [`bound`]: a worker's bound on the handshake work it takes on
//!   (`limits.handshake_queue`): reset at accept, refused at the hello, and whether the
//!   worker has capacity nobody uses;
//! - [`tenant`]: tenants and their accounts: quotas (committed and peak ACU, SCU),
//!   admission against them, over-quota actions, accounting, and the share of a fleet's
//!   quota an instance enforces;
//! - [`meter`]: the rate meter (GCRA) quotas are kept with;
//! - [`clients`]: per-client limits: a request rate with a burst per client (nginx's
//!   `limit_req`) in a table of bounded size shared by the workers, and connections open
//!   per client address (nginx's `limit_conn`);
//! - [`unauthenticated`]: what connections that have not authenticated yet may hold of
//!   a worker (the keyless signer's): a small budget, bounded per address, oldest out.

pub mod bound;
pub mod clients;
pub mod meter;
pub mod tenant;
pub mod unauthenticated;
