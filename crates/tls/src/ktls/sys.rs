//! The kernel TLS ABI (`include/uapi/linux/tls.h`) and the syscalls of the kTLS data
//! path: attaching the `tls` ULP, installing keys, records with their type, sendfile and
//! splice. Everything here is a thin, non-blocking wrapper; readiness is the caller's.

use std::io;
use std::os::fd::RawFd;

use zeroize::Zeroizing;

pub const SOL_TLS: libc::c_int = 282;
pub const TLS_TX: libc::c_int = 1;
pub const TLS_RX: libc::c_int = 2;
/// cmsg type on send: the record type of this message.
const TLS_SET_RECORD_TYPE: libc::c_int = 1;
/// cmsg type on receive: the record type of the returned bytes.
const TLS_GET_RECORD_TYPE: libc::c_int = 2;

pub const TLS_1_2_VERSION: u16 = 0x0303;
pub const TLS_1_3_VERSION: u16 = 0x0304;
pub const TLS_CIPHER_AES_GCM_128: u16 = 51;
pub const TLS_CIPHER_AES_GCM_256: u16 = 52;
pub const TLS_CIPHER_CHACHA20_POLY1305: u16 = 54;

/// TLS record content types (RFC 8446 section 5.1).
pub const RECORD_ALERT: u8 = 21;
pub const RECORD_HANDSHAKE: u8 = 22;
pub const RECORD_APPLICATION_DATA: u8 = 23;

/// A `struct tls12_crypto_info_*` as the kernel reads it: the version and cipher header,
/// then iv, key, salt and rec_seq, each at its fixed size (no padding: all byte arrays
/// after two u16s). Zeroized when dropped, as it holds a traffic key.
pub struct CryptoInfo(Zeroizing<Vec<u8>>);

impl CryptoInfo {
    pub fn new(version: u16, cipher: u16, iv: &[u8], key: &[u8], salt: &[u8], seq: u64) -> Self {
        let mut bytes = Zeroizing::new(Vec::with_capacity(
            4 + iv.len() + key.len() + salt.len() + 8,
        ));
        bytes.extend_from_slice(&version.to_ne_bytes());
        bytes.extend_from_slice(&cipher.to_ne_bytes());
        bytes.extend_from_slice(iv);
        bytes.extend_from_slice(key);
        bytes.extend_from_slice(salt);
        bytes.extend_from_slice(&seq.to_be_bytes());
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cvt_size(ret: libc::ssize_t) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

/// Attaches the `tls` upper-layer protocol. ENOENT: the kernel has no `tls` module.
pub fn attach_tls_ulp(fd: RawFd) -> io::Result<()> {
    const NAME: &[u8] = b"tls";
    // SAFETY: `NAME` outlives the call and its exact length is passed.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_TCP,
            libc::TCP_ULP,
            NAME.as_ptr().cast(),
            NAME.len() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// Installs the keys of one direction (`TLS_TX` or `TLS_RX`).
pub fn set_crypto_info(fd: RawFd, direction: libc::c_int, info: &CryptoInfo) -> io::Result<()> {
    let bytes = info.as_bytes();
    // SAFETY: `bytes` is a live buffer of the length passed; the kernel copies it.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            SOL_TLS,
            direction,
            bytes.as_ptr().cast(),
            bytes.len() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// Room for one cmsg carrying a one-byte record type (CMSG_SPACE(1) is 24 on 64-bit).
#[repr(C, align(8))]
struct RecordTypeCmsg([u8; 32]);

/// Reads decrypted bytes of records of one type, and that type. The kernel never mixes
/// record types in one call; without a control message the bytes are application data.
pub fn recv_record(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, u8)> {
    let mut cmsg = RecordTypeCmsg([0; 32]);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.0.as_mut_ptr().cast();
    msg.msg_controllen = cmsg.0.len() as _;
    // SAFETY: `msg` points at `iov` (over `buf`) and `cmsg`, all live for the call, with
    // their true lengths; the kernel writes at most those lengths.
    let n = cvt_size(unsafe { libc::recvmsg(fd, &mut msg, 0) })?;
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other(
            "kTLS record type control message truncated",
        ));
    }
    let mut record_type = RECORD_APPLICATION_DATA;
    // SAFETY: the CMSG_* macros walk the control buffer the kernel just filled, bounded by
    // msg_controllen; CMSG_DATA of a SOL_TLS/TLS_GET_RECORD_TYPE cmsg holds one byte.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == SOL_TLS && (*c).cmsg_type == TLS_GET_RECORD_TYPE {
                record_type = *libc::CMSG_DATA(c);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n, record_type))
}

/// Sends `data` as one record of type `record_type` (an alert, say) through the kernel.
pub fn send_record(fd: RawFd, record_type: u8, data: &[u8]) -> io::Result<usize> {
    let mut cmsg = RecordTypeCmsg([0; 32]);
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut _,
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.0.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic; the header and its one data byte
    // fit in `cmsg` (32 bytes >= CMSG_SPACE(1)), which is 8-aligned as cmsghdr requires.
    unsafe {
        msg.msg_controllen = libc::CMSG_SPACE(1) as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = SOL_TLS;
        (*c).cmsg_type = TLS_SET_RECORD_TYPE;
        (*c).cmsg_len = libc::CMSG_LEN(1) as _;
        *libc::CMSG_DATA(c) = record_type;
    }
    // SAFETY: `msg` points at `iov` (over `data`, only read) and `cmsg`, live for the call.
    cvt_size(unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) })
}

/// send(2) with MSG_MORE: on a kernel TLS socket the record stays open, so what is sent
/// next (a sendfile) continues it instead of starting a record of its own.
pub fn send_more(fd: RawFd, data: &[u8]) -> io::Result<usize> {
    // SAFETY: `data` is valid for reads of its length for the call; fd is the caller's.
    cvt_size(unsafe {
        libc::send(
            fd,
            data.as_ptr().cast(),
            data.len(),
            libc::MSG_MORE | libc::MSG_NOSIGNAL,
        )
    })
}

/// sendfile(2) from `file` at `*offset` (advanced by the kernel) to socket `out`.
pub fn sendfile(out: RawFd, file: RawFd, offset: &mut i64, count: usize) -> io::Result<usize> {
    // SAFETY: `offset` is a valid, exclusive pointer for the call; the fds are the
    // caller's open descriptors (a bad one is EBADF, not UB).
    cvt_size(unsafe { libc::sendfile(out, file, offset, count) })
}

/// A non-blocking pipe: (read end, write end).
pub fn pipe() -> io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 succeeded, so both are open descriptors that nothing else owns.
    let pipe = unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    };
    // A pipe holds 16 buffers by default, one per page fragment spliced in, and a kTLS
    // record's plaintext can lie in many fragments: 1 MiB (256 buffers) leaves room for
    // a whole 64 KiB step however it is cut. Where the limit
    // (/proc/sys/fs/pipe-max-size) is lower, the default stays.
    // SAFETY: a plain fcntl on the pipe just made.
    let _ = unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, PIPE_SIZE) };
    Ok(pipe)
}

/// The size asked for relay pipes.
const PIPE_SIZE: libc::c_int = 1 << 20;

/// Ends the sending direction of a socket (FIN after what is queued).
pub fn shutdown_write(fd: RawFd) -> io::Result<()> {
    // SAFETY: a plain syscall on the caller's descriptor.
    cvt(unsafe { libc::shutdown(fd, libc::SHUT_WR) }).map(drop)
}

/// splice(2) up to `len` bytes between `from` and `to`, one of which is a pipe.
pub fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: null offsets mean "the fds' own positions"; fds are the caller's.
    cvt_size(unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    })
}
