//! The open-file cache, nginx's `open_file_cache`: what a path under a docroot turned out
//! to be (an open file with its validators, a directory, or an error), kept per worker so
//! a keep-alive request for a known file costs no `openat2`, `statx` or `close`.
//!
//! An entry is trusted for `cache_valid`; the first request after that looks the path up
//! again exactly as an uncached request would (`openat2(RESOLVE_BENEATH)` and `fstat`), so
//! confinement is re-proven on every revalidation and a symlink swapped to point outside
//! the root is refused within `cache_valid`. If the lookup finds the same file (device,
//! inode, size, modification time) the entry is kept and the new descriptor closed;
//! anything else replaces it (new validators, or the 404/403 now due). Errors are cached
//! for the same time, as with nginx's `open_file_cache_errors on`.
//!
//! Bounded: at most `cache_entries` entries per worker, each holding at most one
//! descriptor (directories, errors and files of up to `cache_max_size` bytes, which are
//! kept in memory, hold none); the least recently used eighth is dropped when full, and
//! entries unused for `cache_inactive` are dropped by a sweep at most once a second, so
//! a deleted file's disk space is not held for long. `cache = false`: every request opens
//! and stats its file, as before the cache.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use hyper::header::HeaderValue;

use super::docroot::DocRoot;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    /// A device, socket or FIFO: never served.
    Other,
}

/// Where a file's bytes come from.
pub enum Content {
    /// Read at each request from the open file.
    Fd(Rc<File>),
    /// The whole file, read when it was looked up.
    Memory(Bytes),
    /// Not a file.
    None,
}

/// A path under a docroot, looked up: an open file and its validators, or a directory.
pub struct Opened {
    pub kind: Kind,
    pub len: u64,
    pub mtime: SystemTime,
    /// Ready-made header values: a cached response copies no strings.
    pub etag: HeaderValue,
    pub last_modified: HeaderValue,
    pub content: Content,
    /// Device, inode, size and modification time in nanoseconds: the same file.
    identity: (u64, u64, u64, i64, i64),
}

/// What every lookup does, cached or not: opens `rel` beneath `root` and stats it.
fn lookup(root: &DocRoot, rel: &[u8]) -> io::Result<(File, Metadata)> {
    let file = root.open_beneath(rel)?;
    let meta = file.metadata()?;
    Ok((file, meta))
}

fn kind_of(meta: &Metadata) -> Kind {
    if meta.is_file() {
        Kind::File
    } else if meta.is_dir() {
        Kind::Dir
    } else {
        Kind::Other
    }
}

fn identity_of(meta: &Metadata) -> (u64, u64, u64, i64, i64) {
    (
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec(),
    )
}

impl Opened {
    /// Files of up to `keep` bytes are read into memory and their descriptor closed.
    fn new(file: File, meta: &Metadata, keep: u64) -> Opened {
        let kind = kind_of(meta);
        let len = meta.len();
        let mtime = SystemTime::UNIX_EPOCH + Duration::from_secs(meta.mtime().max(0) as u64);
        let content = match kind {
            Kind::File if len <= keep => match read_whole(&file, len) {
                Some(bytes) => Content::Memory(bytes),
                None => Content::Fd(Rc::new(file)),
            },
            Kind::File => Content::Fd(Rc::new(file)),
            _ => Content::None,
        };
        Opened {
            kind,
            len,
            mtime,
            etag: ascii_value(format!("\"{:x}-{:x}\"", meta.mtime().max(0), len)),
            last_modified: ascii_value(httpdate::fmt_http_date(mtime)),
            content,
            identity: identity_of(meta),
        }
    }
}

fn ascii_value(text: String) -> HeaderValue {
    HeaderValue::try_from(text).expect("hex digits, quotes and an HTTP date are valid")
}

/// The file's `len` bytes, or None if it is not that long any more (then it is read
/// from its descriptor at each request, which notices a short file).
fn read_whole(file: &File, len: u64) -> Option<Bytes> {
    let mut buf = vec![0; len as usize];
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], filled as u64) {
            Ok(0) => return None,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(buf.into())
}

/// A lookup's result: the file, or the errno that refused it (ENOENT, EXDEV...).
pub type Found = Result<Rc<Opened>, i32>;

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// Entries by docroot, then by normalised path.
type Roots = HashMap<u64, HashMap<Box<[u8]>, Entry>>;

struct Entry {
    found: Found,
    checked: Instant,
    used: Instant,
}

/// What the open-file cache may keep, and for how long (nginx's `open_file_cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caching {
    /// Off opens and stats every file on every request.
    pub on: bool,
    /// Entries per worker.
    pub entries: usize,
    /// How long an entry is served before it is looked up again.
    pub valid: Duration,
    /// Entries unused this long are dropped.
    pub inactive: Duration,
    /// Files up to this many bytes are kept in memory.
    pub max_size: u64,
}

/// A worker's open files (and small files' bytes), by docroot and path, kept as
/// [`Caching`] allows.
#[derive(Default)]
pub struct FileCache {
    roots: RefCell<Roots>,
    len: Cell<usize>,
    swept: Cell<Option<Instant>>,
}

impl FileCache {
    /// Looks `rel` up beneath `root`, from the cache where `settings` allow.
    pub fn open(&self, root: &DocRoot, rel: &[u8], settings: &Caching) -> Found {
        let keep = settings.max_size;
        let load = || {
            lookup(root, rel)
                .map(|(file, meta)| Rc::new(Opened::new(file, &meta, keep)))
                .map_err(|e| errno(&e))
        };
        if !settings.on {
            return load();
        }
        let now = Instant::now();
        self.sweep(now, settings.inactive);
        let mut roots = self.roots.borrow_mut();
        if let Some(entry) = roots.get_mut(&root.id()).and_then(|m| m.get_mut(rel)) {
            entry.used = now;
            if now.duration_since(entry.checked) >= settings.valid {
                entry.checked = now;
                // The same file keeps its entry (and its bytes, unread); anything else is
                // looked at afresh.
                entry.found = match (&entry.found, lookup(root, rel)) {
                    (Ok(old), Ok((_, meta)))
                        if old.identity == identity_of(&meta) && old.kind == kind_of(&meta) =>
                    {
                        Ok(old.clone())
                    }
                    (_, Ok((file, meta))) => Ok(Rc::new(Opened::new(file, &meta, keep))),
                    (_, Err(e)) => Err(errno(&e)),
                };
            }
            return entry.found.clone();
        }
        let found = load();
        if self.len.get() >= settings.entries.max(1) {
            self.evict(&mut roots);
        }
        roots.entry(root.id()).or_default().insert(
            rel.into(),
            Entry {
                found: found.clone(),
                checked: now,
                used: now,
            },
        );
        self.len.set(self.len.get() + 1);
        found
    }

    /// Drops the least recently used eighth (at least one entry).
    fn evict(&self, roots: &mut Roots) {
        let mut ages: Vec<Instant> = roots
            .values()
            .flat_map(|m| m.values().map(|e| e.used))
            .collect();
        let drop = (ages.len() / 8).max(1);
        let (_, &mut cutoff, _) = ages.select_nth_unstable(drop - 1);
        self.retain(roots, |e| e.used > cutoff);
    }

    /// At most once a second: drops entries unused for `inactive`.
    fn sweep(&self, now: Instant, inactive: Duration) {
        if self
            .swept
            .get()
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            return;
        }
        self.swept.set(Some(now));
        let mut roots = self.roots.borrow_mut();
        self.retain(&mut roots, |e| now.duration_since(e.used) < inactive);
    }

    fn retain(&self, roots: &mut Roots, keep: impl Fn(&Entry) -> bool) {
        roots.retain(|_, m| {
            m.retain(|_, e| keep(e));
            !m.is_empty()
        });
        self.len.set(roots.values().map(HashMap::len).sum());
    }
}
