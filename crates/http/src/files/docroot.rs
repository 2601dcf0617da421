//! A docroot and the one way files are opened under it.
//!
//! Confinement is the kernel's job: every file is opened with `openat2(RESOLVE_BENEATH)`
//! relative to the docroot's directory handle, so neither `..` nor a symlink can reach
//! outside it, whatever the path spelling.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// An open docroot directory.
#[derive(Debug)]
pub struct DocRoot {
    path: PathBuf,
    dir: OwnedFd,
    /// Unique in the process: a reload opens new docroots, whose files are cached apart.
    id: u64,
}

impl DocRoot {
    /// Opens the directory at `path` as a docroot.
    pub fn open(path: &Path) -> io::Result<Self> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        let dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            dir: dir.into(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    pub(super) fn id(&self) -> u64 {
        self.id
    }

    /// Opens `rel` (no leading slash, already normalised) strictly beneath the root.
    pub(super) fn open_beneath(&self, rel: &[u8]) -> io::Result<File> {
        let rel = if rel.is_empty() { b".".as_slice() } else { rel };
        match terminus_sys::open_beneath(&self.dir, rel) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                self.open_beneath_by_canonical_path(rel)
            }
            other => other,
        }
    }

    /// For kernels before 5.6: resolve symlinks and check the result stays under the root.
    fn open_beneath_by_canonical_path(&self, rel: &[u8]) -> io::Result<File> {
        let root = self.path.canonicalize()?;
        let target = root.join(OsStr::from_bytes(rel)).canonicalize()?;
        if !target.starts_with(&root) {
            return Err(io::Error::from_raw_os_error(libc::EXDEV));
        }
        File::open(target)
    }
}
