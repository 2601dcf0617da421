//! Descriptors passed between processes over a Unix stream socket (SCM_RIGHTS, unix(7)):
//! how a running terminus hands its listening sockets to the process replacing it.
//!
//! A message is some bytes and at most [`MAX_FDS`] descriptors; the kernel delivers the
//! descriptors with the first byte of the bytes they were sent with, so a receiver
//! reading one message at a time (the callers frame theirs) gets them with it. They
//! arrive close-on-exec (`MSG_CMSG_CLOEXEC`): a process the receiver starts later
//! inherits none of them by accident.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// The most descriptors one message carries (the kernel's SCM_MAX_FD is 253).
pub const MAX_FDS: usize = 200;

/// Room for the control message of [`MAX_FDS`] descriptors, aligned as a `cmsghdr`
/// must be (its `size_t` length first): a byte vector's start need not be.
fn control_buffer() -> Vec<u64> {
    // SAFETY: CMSG_SPACE only computes a size from its argument.
    let bytes =
        unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) as usize };
    vec![0u64; bytes.div_ceil(std::mem::size_of::<u64>())]
}

/// Sends `data` (not empty) with `fds` (at most [`MAX_FDS`]) on `socket`, all of `data`
/// or an error. The descriptors stay open here: the receiver gets copies.
pub fn send_with_fds(socket: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if data.is_empty() || fds.len() > MAX_FDS {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut control = control_buffer();
    let mut sent = 0;
    while sent < data.len() {
        let rest = &data[sent..];
        let mut iov = libc::iovec {
            iov_base: rest.as_ptr() as *mut libc::c_void,
            iov_len: rest.len(),
        };
        // SAFETY: msghdr is plain data for which all-zero is valid (no name, no
        // control); the fields set below point at `iov` and `control`, which outlive the
        // sendmsg call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        // The descriptors go with the first byte only.
        if sent == 0 && !fds.is_empty() {
            let bytes = std::mem::size_of_val(fds);
            // SAFETY: CMSG_SPACE and CMSG_LEN compute sizes; `control` has room for
            // MAX_FDS descriptors' control message and fds.len() <= MAX_FDS, so
            // CMSG_FIRSTHDR is non-null and CMSG_DATA points inside `control` with
            // `bytes` bytes of room; BorrowedFd is a transparent RawFd, so the copy
            // writes fds.len() descriptors.
            unsafe {
                msg.msg_control = control.as_mut_ptr().cast();
                msg.msg_controllen = libc::CMSG_SPACE(bytes as u32) as usize;
                let cmsg = libc::CMSG_FIRSTHDR(&msg);
                (*cmsg).cmsg_level = libc::SOL_SOCKET;
                (*cmsg).cmsg_type = libc::SCM_RIGHTS;
                (*cmsg).cmsg_len = libc::CMSG_LEN(bytes as u32) as usize;
                std::ptr::copy_nonoverlapping(
                    fds.as_ptr().cast::<u8>(),
                    libc::CMSG_DATA(cmsg),
                    bytes,
                );
            }
        }
        // SAFETY: `msg` is a valid msghdr whose pointers are live (see above); the
        // socket is open for the call (borrowed from `socket`).
        let n = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        sent += n as usize;
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes on `socket` (0: the peer closed) and the
/// descriptors that came with them, appended to `fds`. Descriptors beyond what a
/// message may carry are an error (the kernel closed them: `MSG_CTRUNC`).
pub fn recv_with_fds(
    socket: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    let mut control = control_buffer();
    loop {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: as in send_with_fds; `iov` and `control` outlive recvmsg.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(control.as_slice());
        // SAFETY: `msg` points at live buffers of the lengths it names.
        let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // SAFETY: recvmsg filled `msg`'s control part with msg_controllen bytes; the
        // CMSG_* macros walk it within that length, and each SCM_RIGHTS message's data
        // holds (cmsg_len - CMSG_LEN(0)) / size_of::<RawFd>() descriptors, newly
        // installed in this process and owned by no one else: each is wrapped once.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                    let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                    for i in 0..bytes / std::mem::size_of::<RawFd>() {
                        fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::other(
                "more descriptors came than a message may carry",
            ));
        }
        return Ok(n as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    /// A descriptor sent is a working copy of the sender's: a pipe's write end sent
    /// across, written there, read here.
    #[test]
    fn a_descriptor_sent_is_the_same_open_file() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut reader, writer) = std::io::pipe().unwrap();
        send_with_fds(&a, b"pipe", &[writer.as_fd()]).unwrap();
        drop(writer);
        let (mut buf, mut fds) = ([0u8; 16], Vec::new());
        let n = recv_with_fds(&b, &mut buf, &mut fds).unwrap();
        assert_eq!(&buf[..n], b"pipe");
        assert_eq!(fds.len(), 1);
        let mut copy = std::fs::File::from(fds.pop().unwrap());
        copy.write_all(b"through").unwrap();
        drop(copy);
        let mut got = String::new();
        reader.read_to_string(&mut got).unwrap();
        assert_eq!(got, "through");
    }

    #[test]
    fn too_many_descriptors_are_refused() {
        let (a, _b) = UnixStream::pair().unwrap();
        let fd = a.as_fd();
        assert!(send_with_fds(&a, b"x", &vec![fd; MAX_FDS + 1]).is_err());
    }
}
