//! terminus's integration tests, one binary: each module below is an area (its own doc
//! says what it covers) and `harness` is what they share (a spawned `terminus`, its
//! configuration, certificates, real clients, load). One binary links the harness and the
//! dependencies once, instead of once per area.
//!
//! The areas' tests run in one process, in parallel: a test that measures rates or time,
//! or saturates a CPU, holds [`harness::exclusive`], which keeps every other test of the
//! binary from starting a server while it runs (see there).
//!
//! `tests/allocations.rs` is a binary of its own: its counting `#[global_allocator]`
//! would be every test's allocator here (its doc says more).

mod harness;

mod access;
mod acme;
mod admin;
mod architecture;
mod capacity;
mod clients;
mod compression;
mod conformance;
mod engine_concurrency;
mod error_pages;
mod errors;
mod file_cache;
mod fleet;
mod http1;
mod http2;
mod http3;
mod idle;
mod keyless;
mod ktls_guest;
mod lifecycle;
mod limits;
mod load;
mod logs;
mod mtls;
mod observe;
mod overload;
mod package;
mod proxy;
mod proxy_wire;
mod record_layer;
mod redirects;
mod rewrites;
mod speed;
mod static_files;
mod status_page;
mod systemd;
mod tenants;
mod upgrade;
