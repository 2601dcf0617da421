//! USDT probes: static trace points bpftrace (or SystemTap, or gdb) can attach to in a
//! running terminus, provider `terminus`.
//!
//! Each probe is a NOP and an ELF note (`readelf -n terminus | grep -A4 stapsdt` lists
//! them): nothing runs until a tracer attaches. An argument that costs work to build
//! (`handshake_end`'s record, `response`'s byte count) is built only while a tracer is
//! attached (an SDT semaphore the tracer raises). bpftrace on x86-64 reads six arguments at most, so no
//! probe takes more; strings are passed as a pointer and a length (`str(arg1, arg2)`).
//!
//! | probe | arguments |
//! |---|---|
//! | `handshake_start` | id |
//! | `handshake_end` | id, ok (1/0), `struct handshake *` (below) |
//! | `crypto_submit` | id, op, op length |
//! | `crypto_done` | id, op, op length, queue ns, compute ns, ok (1/0) |
//! | `batch` | op, op length, batch size, backend, backend length |
//! | `ktls` | id, 1 (handed to the kernel) or 0 (kept in userspace), cause, cause length |
//! | `response` | id, status, body bytes (-1 when not known up front) |
//!
//! `id` is the connection's number, the same in every probe of one connection. The
//! scripts in `contrib/bpftrace/` use them, and `contrib/bpftrace/terminus.h` declares
//! [`HandshakeRecord`] for them: the two must change together.

#![allow(unsafe_code)] // the `probe!` macros' inline asm: a NOP and a note, nothing more.

use probe::{probe, probe_lazy};

/// What `handshake_end` points to: the handshake's phases (terminus-observe's order)
/// and labels, strings NUL-padded.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct HandshakeRecord {
    /// Accept to the handshake's end (to the failure, for one that failed).
    pub total_ns: u64,
    /// hello_wait, hello_read, admission, to_crypto, crypto_queue, crypto_compute,
    /// remote_sign, server, client; all zero for a failed handshake.
    pub phases_ns: [u64; 9],
    /// 1 when a session was resumed.
    pub resumed: u64,
    /// `TLSv1.3`, `TLSv1.2`, or empty.
    pub version: [u8; 8],
    /// The key that signed, `none`, or empty.
    pub key_type: [u8; 16],
    /// `ok`, or why the handshake failed.
    pub result: [u8; 16],
    /// The tenant charged.
    pub tenant: [u8; 32],
}

impl HandshakeRecord {
    /// Copies `s` into a NUL-padded field, cut to leave its final NUL.
    pub fn text<const N: usize>(s: &str) -> [u8; N] {
        let mut out = [0u8; N];
        let n = s.len().min(N - 1);
        out[..n].copy_from_slice(&s.as_bytes()[..n]);
        out
    }
}

/// A connection accepted: its handshake starts.
#[inline(always)]
pub fn handshake_start(id: u64) {
    probe!(terminus, handshake_start, id);
}

/// A handshake ended, `ok` or not; `record` is built only while a tracer is attached.
#[inline(always)]
pub fn handshake_end(id: u64, ok: bool, record: impl FnOnce() -> HandshakeRecord) {
    let mut built = None;
    probe_lazy!(
        terminus,
        handshake_end,
        id,
        ok as u64,
        built.insert(record()) as *const HandshakeRecord
    );
}

/// A crypto request entered the engine's queue.
#[inline(always)]
pub fn crypto_submit(id: u64, op: &'static str) {
    probe!(terminus, crypto_submit, id, op.as_ptr(), op.len());
}

/// A crypto request was answered; `times` (its queue wait and compute time, in ns) is
/// asked only while a tracer is attached.
#[inline(always)]
pub fn crypto_done(id: u64, op: &'static str, ok: bool, times: impl FnOnce() -> (u64, u64)) {
    let mut asked = None;
    probe_lazy!(
        terminus,
        crypto_done,
        id,
        op.as_ptr(),
        op.len(),
        asked.insert(times()).0,
        asked.map_or(0, |(_, compute)| compute),
        ok as u64
    );
}

/// A batch of `size` requests went to `backend`.
#[inline(always)]
pub fn batch(op: &'static str, size: usize, backend: &'static str) {
    probe!(
        terminus,
        batch,
        op.as_ptr(),
        op.len(),
        size,
        backend.as_ptr(),
        backend.len()
    );
}

/// The record layer was chosen after the handshake: the kernel's (`kernel`), or
/// userspace's for `cause`.
#[inline(always)]
pub fn ktls(id: u64, kernel: bool, cause: &'static str) {
    probe!(
        terminus,
        ktls,
        id,
        kernel as u64,
        cause.as_ptr(),
        cause.len()
    );
}

/// A response's head was written; `bytes` (its body's length, -1 when not known up
/// front) is asked only while a tracer is attached.
#[inline(always)]
pub fn response(id: u64, status: u16, bytes: impl FnOnce() -> i64) {
    probe_lazy!(terminus, response, id, status, bytes());
}
