//! The Linux system calls terminus makes outside std and tokio, each behind one safe
//! function, so that `unsafe` lives here (and at the crypto FFI, the kTLS socket options
//! and the coroutine bridge) and nowhere else.
//!
//! Every function returns the OS error instead of ignoring it: the caller decides
//! whether failing to pin a thread or raise a limit matters.

#![allow(unsafe_code)]

pub mod fds;

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd};
use std::time::Duration;

/// Runs `make` with the process's file-mode creation mask set to `mask`, then puts the
/// old mask back: a file made by a call that takes no mode (a Unix socket's `bind`) is
/// never, even for an instant, more open than `mask` lets it be. The mask is the
/// process's: call it while no other thread makes files.
pub fn with_umask<T>(mask: u32, make: impl FnOnce() -> T) -> T {
    // SAFETY: umask only swaps the process's creation mask and cannot fail.
    let old = unsafe { libc::umask(mask as libc::mode_t) };
    let made = make();
    // SAFETY: as above, putting the previous mask back.
    unsafe { libc::umask(old) };
    made
}

/// Pins the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    run_current_thread_on(&[cpu])
}

/// Lets the calling thread run on `cpus` only (an error for none, or one past the
/// kernel's CPU set).
pub fn run_current_thread_on(cpus: &[usize]) -> io::Result<()> {
    if cpus.is_empty() || cpus.iter().any(|&c| c >= libc::CPU_SETSIZE as usize) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: cpu_set_t is a plain bitmask for which all-zero is the empty set; CPU_SET
    // writes inside it (each cpu was bounds-checked above), and sched_setaffinity reads
    // exactly size_of::<cpu_set_t>() bytes of it for the calling thread (pid 0).
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// CPUs configured on the machine, whether or not this process may run on them (a
/// `taskset`-restricted process can still name the others).
pub fn configured_cpus() -> usize {
    // SAFETY: sysconf only reads a system setting.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    n.max(1) as usize
}

/// CLOCK_MONOTONIC now, in microseconds: the clock systemd's `MONOTONIC_USEC` is read
/// on (std's `Instant` does not give its value).
pub fn monotonic_usec() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `now` is, and CLOCK_MONOTONIC
    // always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1_000
}

/// User plus system CPU time of the whole process so far.
pub fn process_cpu_time() -> io::Result<Duration> {
    cpu_time(libc::RUSAGE_SELF)
}

/// User plus system CPU time of the calling thread so far.
pub fn thread_cpu_time() -> io::Result<Duration> {
    cpu_time(libc::RUSAGE_THREAD)
}

/// User plus system CPU time of thread `tid` of this process so far, from
/// `/proc/self/task/TID/stat` (clock-tick resolution): another thread's, which getrusage
/// cannot give.
pub fn task_cpu_time(tid: u32) -> io::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))?;
    // Fields after the command name, which is in parentheses and may hold spaces:
    // state is field 3, utime 14 and stime 15.
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no ) in stat"))?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i - 3).and_then(|f| f.parse::<u64>().ok());
    let (Some(user), Some(system)) = (ticks(14), ticks(15)) else {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "short stat"));
    };
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_second = if per_second > 0 {
        per_second as u64
    } else {
        100
    };
    Ok(Duration::from_nanos(
        (user + system) * (1_000_000_000 / per_second),
    ))
}

/// The calling thread's id (what `/proc/self/task/` names it by).
pub fn current_tid() -> io::Result<u32> {
    let link = std::fs::read_link("/proc/thread-self")?;
    link.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unreadable /proc/thread-self"))
}

fn cpu_time(who: libc::c_int) -> io::Result<Duration> {
    // SAFETY: rusage is a plain C struct for which all-zero is valid; getrusage writes
    // only into the one we pass.
    let (rc, usage) = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        let rc = libc::getrusage(who, &mut usage);
        (rc, usage)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    Ok(tv(usage.ru_utime) + tv(usage.ru_stime))
}

/// Raises the soft open-file limit toward `wanted`, up to the hard limit, and returns the
/// soft limit now in force.
pub fn raise_open_file_limit(wanted: u64) -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur >= wanted {
        return Ok(lim.rlim_cur);
    }
    lim.rlim_cur = wanted.min(lim.rlim_max);
    // SAFETY: setrlimit only reads the struct we pass.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(lim.rlim_cur)
}

/// Opens `path` (relative) read-only strictly beneath the directory `dir` with
/// `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`: neither `..`, nor an absolute
/// symlink, nor a `/proc` magic link can leave `dir`. `ENOSYS` (kernels before 5.6) is
/// returned as is, for the caller to choose a fallback.
pub fn open_beneath(dir: impl AsFd, path: &[u8]) -> io::Result<File> {
    let c_path = CString::new(path).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: open_how is a plain C struct of integers (non-exhaustive in libc, so it
    // cannot be built field by field); all-zero is its documented "nothing set" value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 reads `how` (fully initialised, of the size we pass) and the
    // NUL-terminated path; the directory fd is borrowed for the duration of the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_fd().as_raw_fd(),
            c_path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

/// How long ago the TCP connection `socket` last received data, or was established if it
/// has received none (the kernel's `tcpi_last_data_recv`, to its tick: 1-10 ms). For a
/// connection just accepted, that is how long it waited in the listen queue, or how long
/// its first bytes have.
pub fn tcp_quiet_for(socket: impl AsFd) -> io::Result<Duration> {
    // SAFETY: tcp_info is a plain C struct of integers, for which all-zero is valid.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info`, which is that large, and
    // the new length into `len`; the fd is borrowed for the call.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_fd().as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Duration::from_millis(u64::from(info.tcpi_last_data_recv)))
}

/// Sets `socket`'s receive and send buffers to `bytes` each: above `net.core.rmem_max`
/// and `wmem_max` where the process may (`SO_RCVBUFFORCE`, with CAP_NET_ADMIN), else as
/// far as those limits allow. Returns the receive buffer the kernel granted (its usable
/// half: the kernel doubles the value for its bookkeeping).
pub fn set_socket_buffers(socket: impl AsFd, bytes: usize) -> io::Result<usize> {
    let fd = socket.as_fd().as_raw_fd();
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    let set = |option| {
        // SAFETY: setsockopt reads one c_int from `value`, which lives across the call;
        // the fd is borrowed for the call.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                option,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        if set(force).is_err() {
            set(plain)?;
        }
    }
    let mut granted: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes (one c_int) into `granted`, and the
    // new length into `len`; the fd is borrowed for the call.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&mut granted as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(granted).unwrap_or(0) / 2)
}

/// This host's name (`gethostname`: the UTS namespace's, as `hostname` prints it). Not
/// read from /proc/sys/kernel/hostname, which a service with systemd's `ProcSubset=pid`
/// (the packaged unit) cannot see.
pub fn hostname() -> io::Result<String> {
    // HOST_NAME_MAX is 64 on Linux; room for it and the NUL.
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`, which we own.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let len = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..len]).into_owned())
}

/// The CPUs this thread may run on (its affinity mask), in order.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is a plain bitmask for which all-zero is valid; sched_getaffinity
    // writes at most size_of::<cpu_set_t>() bytes into it for the calling thread (pid 0),
    // and CPU_ISSET reads inside it (i < CPU_SETSIZE).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((0..libc::CPU_SETSIZE as usize)
            .filter(|&i| libc::CPU_ISSET(i, &set))
            .collect())
    }
}

/// The CPUs a kernel CPU list names ("0-3,8,10-11", as in sysfs and `Cpus_allowed_list`).
pub fn cpu_list(list: &str) -> Vec<usize> {
    list.trim()
        .split(',')
        .filter_map(|part| match part.split_once('-') {
            Some((a, b)) => Some((a.parse().ok()?..=b.parse().ok()?).collect::<Vec<usize>>()),
            None => part.parse().ok().map(|c| vec![c]),
        })
        .flatten()
        .collect()
}

/// The SMT siblings of `cpu` as the kernel lists them (`cpu` among them), or just `cpu`
/// where the kernel does not say.
pub fn smt_siblings(cpu: usize) -> Vec<usize> {
    std::fs::read_to_string(format!(
        "/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
    ))
    .map(|list| cpu_list(&list))
    .ok()
    .filter(|s| s.contains(&cpu))
    .unwrap_or_else(|| vec![cpu])
}

/// Bytes the C allocator has handed out and not had back (its arenas' chunks in use and
/// its mmapped blocks), or `None` where the allocator is not glibc's.
pub fn allocator_in_use_bytes() -> Option<usize> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's own statistics and returns them by
        // value; it takes the arenas' locks itself. (glibc marks it MT-unsafe only against
        // a concurrent mallopt, which terminus never calls. With a #[global_allocator]
        // other than the system's, this would describe the wrong allocator.)
        let info = unsafe { libc::mallinfo2() };
        Some(info.uordblks + info.hblkhd)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

/// Gives the pages of the C allocator's free memory back to the kernel (glibc's
/// `malloc_trim(0)`: every arena, not only the top of the heap). Returns what glibc says:
/// true when some free chunk spans a whole page (it may have been released before).
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes the arenas' locks and only releases pages of chunks
        // that are free; memory in use is untouched.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_buffers_are_raised_beyond_the_default() {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let granted = set_socket_buffers(&socket, 1 << 20).unwrap();
        // The default is net.core.rmem_default (208 KiB on Debian). Root (which CI is)
        // gets the whole MiB past any limit; anyone else as much as rmem_max allows.
        let max: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // SAFETY: geteuid has no preconditions and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        let want = if root { 1 << 20 } else { (1 << 20).min(max) };
        assert!(granted >= want, "granted {granted}, wanted {want}");
    }

    #[test]
    fn the_hostname_is_the_kernels() {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert_eq!(hostname().unwrap(), kernel.trim());
    }

    #[test]
    fn open_beneath_refuses_to_leave_the_directory() {
        let dir = std::env::temp_dir().join(format!("terminus-sys-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/file"), b"x").unwrap();
        let _ = std::fs::remove_file(dir.join("sub/out"));
        std::os::unix::fs::symlink("/etc/passwd", dir.join("sub/out")).unwrap();
        let root = File::open(dir.join("sub")).unwrap();
        assert!(open_beneath(&root, b"file").is_ok());
        for escape in [b"../sub/file".as_slice(), b"/etc/passwd", b"out"] {
            let e = open_beneath(&root, escape).expect_err("escaped the directory");
            assert_eq!(e.raw_os_error(), Some(libc::EXDEV), "{escape:?}: {e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// What admission control reads at accept: a connection left in the listen queue
    /// reports the time it waited there.
    #[test]
    fn a_connection_reports_how_long_it_waited_to_be_accepted() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        std::thread::sleep(Duration::from_millis(60));
        let (accepted, _) = listener.accept().unwrap();
        let waited = tcp_quiet_for(&accepted).unwrap();
        assert!(waited >= Duration::from_millis(40), "{waited:?}");
        assert!(thread_cpu_time().is_ok());
    }

    /// Memory freed in the middle of the heap stays with the allocator until released.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn freed_memory_goes_back_to_the_kernel_when_released() {
        fn rss_kib() -> usize {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
            line.split_whitespace().nth(1).unwrap().parse().unwrap()
        }
        // 48 MiB in blocks below the mmap threshold, every page touched; the last block
        // stays, so that the freed ones are not at the top of the heap.
        let mut blocks: Vec<Vec<u8>> = (0..12 * 1024).map(|_| vec![1u8; 4096]).collect();
        let last = blocks.pop();
        let in_use = allocator_in_use_bytes().unwrap();
        drop(blocks);
        assert!(in_use.saturating_sub(allocator_in_use_bytes().unwrap()) > 40 << 20);
        let before = rss_kib();
        assert!(release_free_memory());
        let after = rss_kib();
        assert!(
            before.saturating_sub(after) > 30 * 1024,
            "RSS {before} KiB -> {after} KiB after release"
        );
        drop(last);
    }

    #[test]
    fn a_thread_runs_on_the_cpus_it_is_given() {
        let allowed = allowed_cpus().unwrap();
        std::thread::spawn(move || {
            let last = *allowed.last().unwrap();
            run_current_thread_on(&[last]).unwrap();
            assert_eq!(allowed_cpus().unwrap(), vec![last]);
            run_current_thread_on(&allowed).unwrap();
            assert_eq!(allowed_cpus().unwrap(), allowed);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn cpu_lists_read_as_the_kernel_writes_them() {
        assert_eq!(cpu_list("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(cpu_list("5"), vec![5]);
        assert_eq!(cpu_list(""), Vec::<usize>::new());
    }

    #[test]
    fn pinning_to_a_missing_cpu_is_an_error() {
        assert!(pin_current_thread(libc::CPU_SETSIZE as usize).is_err());
        assert!(run_current_thread_on(&[]).is_err());
        assert!(!allowed_cpus().unwrap().is_empty());
        assert!(process_cpu_time().is_ok());
        assert!(configured_cpus() >= 1);
    }
}
