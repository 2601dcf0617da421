//! Who may use how much of the machine's crypto: tenants, their quotas and what happens
//! beyond them. This is policy; the crypto engine (`terminus-engine`) keeps the
//! mechanism: what each operation costs here (`terminus_engine::capacity`), fair
//! queueing by the weights it is given and charging what it computed, through the
//! [`terminus_engine::Payer`] a handshake carries (here, a tenant's [`tenant::Hold`]).
//!
//! - [`tenant`]: tenants and their accounts: quotas (committed and peak ACU, SCU),
//!   admission against them, over-quota actions, accounting, and the share of a fleet's
//!   quota an instance enforces;
//! - [`meter`]: the rate meter (GCRA) quotas are kept with.

pub mod meter;
pub mod tenant;
