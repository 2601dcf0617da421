//! What wide vectors cost the rest of the core, and where the batches should run.
//!
//! On Intel Skylake-SP and its successors, AVX-512 lowers the core's clock (its frequency
//! licence) for a while after the last wide instruction, so the HTTP parsing and record
//! sealing a worker does right after a crypto_mb batch can run slower than the batch
//! saved; AMD Zen 4 has no such licence, Sapphire Rapids a smaller one. Nothing here
//! assumes which machine this is: [`after_effect`] measures it on the cores at hand (the
//! mechanism), [`cores`] divides the CPUs, [`placement`] decides from the measurement where batches run (the policy).

pub mod after_effect;
pub mod cores;
pub mod placement;

pub use after_effect::{AfterEffect, Ratio, Settings};
pub use placement::{decide, Decision, Inputs, Placement};
