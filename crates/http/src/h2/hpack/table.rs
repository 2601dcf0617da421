//! HPACK's two tables (RFC 7541 section 2.3): the static table (Appendix A), 61 fields
//! every peer knows by index, index 1 first; and a dynamic table, the fields a peer's
//! encoder chose to index, newest first from index 62, bounded in bytes.

use std::collections::VecDeque;

/// The static table, `STATIC[i - 1]` being index `i`.
pub const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// The static entry at HPACK index `index` (1 to 61).
pub fn static_entry(index: u32) -> Option<(&'static [u8], &'static [u8])> {
    let i = usize::try_from(index).ok()?.checked_sub(1)?;
    STATIC.get(i).copied()
}

/// The static index of a field name (the lowest where a name has several), for an
/// encoder that names fields by index. Written as a match so it compiles to a few
/// length-and-byte comparisons rather than a scan of the table.
pub fn static_name_index(name: &[u8]) -> Option<u32> {
    Some(match name {
        b":authority" => 1,
        b":method" => 2,
        b":path" => 4,
        b":scheme" => 6,
        b":status" => 8,
        b"accept-charset" => 15,
        b"accept-encoding" => 16,
        b"accept-language" => 17,
        b"accept-ranges" => 18,
        b"accept" => 19,
        b"access-control-allow-origin" => 20,
        b"age" => 21,
        b"allow" => 22,
        b"authorization" => 23,
        b"cache-control" => 24,
        b"content-disposition" => 25,
        b"content-encoding" => 26,
        b"content-language" => 27,
        b"content-length" => 28,
        b"content-location" => 29,
        b"content-range" => 30,
        b"content-type" => 31,
        b"cookie" => 32,
        b"date" => 33,
        b"etag" => 34,
        b"expect" => 35,
        b"expires" => 36,
        b"from" => 37,
        b"host" => 38,
        b"if-match" => 39,
        b"if-modified-since" => 40,
        b"if-none-match" => 41,
        b"if-range" => 42,
        b"if-unmodified-since" => 43,
        b"last-modified" => 44,
        b"link" => 45,
        b"location" => 46,
        b"max-forwards" => 47,
        b"proxy-authenticate" => 48,
        b"proxy-authorization" => 49,
        b"range" => 50,
        b"referer" => 51,
        b"refresh" => 52,
        b"retry-after" => 53,
        b"server" => 54,
        b"set-cookie" => 55,
        b"strict-transport-security" => 56,
        b"transfer-encoding" => 57,
        b"user-agent" => 58,
        b"vary" => 59,
        b"via" => 60,
        b"www-authenticate" => 61,
        _ => return None,
    })
}

/// What RFC 7541 section 4.1 adds to an entry's name and value when counting the table's
/// size: an estimate of an entry's overhead, so that many empty entries still fill it.
pub const ENTRY_OVERHEAD: usize = 32;

/// The first index past the static table: the dynamic table's newest entry.
pub const FIRST_DYNAMIC: u32 = STATIC.len() as u32 + 1;

/// A dynamic table, its entries' bytes in one buffer rather than an allocation each:
/// a browser indexes most of what it sends, a new `:path` on most requests.
///
/// New entries are appended to `bytes` and old ones evicted from its front by moving
/// `start`; the live bytes are moved back to the front only when appending would grow
/// the buffer past one and a half times the table's size, so the copying is amortised
/// and the buffer never holds more than that (live entries are at most `max_size`).
#[derive(Debug, Default)]
pub struct DynamicTable {
    bytes: Vec<u8>,
    /// Where the oldest entry's bytes begin in `bytes`.
    start: usize,
    /// Oldest first; offsets are into `bytes`.
    entries: VecDeque<Entry>,
    /// The table's size as RFC 7541 section 4.1 counts it.
    size: usize,
    max_size: usize,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    offset: u32,
    name_len: u32,
    value_len: u32,
}

impl DynamicTable {
    /// An empty table of at most `max_size` bytes (as section 4.1 counts them).
    pub fn new(max_size: usize) -> Self {
        Self {
            max_size,
            ..Self::default()
        }
    }

    /// The table's size now, as section 4.1 counts it.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The largest size the table may reach now.
    pub fn max_size(&self) -> usize {
        self.max_size
    }

    /// How many entries the table holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table holds no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The heap the table holds, for memory accounting.
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity() + self.entries.capacity() * std::mem::size_of::<Entry>()
    }

    /// The entry `i` places from the newest (0 is HPACK index 62).
    pub fn get(&self, i: usize) -> Option<(&[u8], &[u8])> {
        let entry = self.entries.get(self.entries.len().checked_sub(i + 1)?)?;
        let name = entry.offset as usize;
        let value = name + entry.name_len as usize;
        Some((
            &self.bytes[name..value],
            &self.bytes[value..value + entry.value_len as usize],
        ))
    }

    /// Sets the table's maximum size (a size update in a field block, or the size an
    /// encoder chooses), evicting the oldest entries until the table fits.
    pub fn set_max_size(&mut self, max_size: usize) {
        self.max_size = max_size;
        self.evict_to(max_size);
        if self.entries.is_empty() {
            // Nothing to keep: give the memory back rather than hold it while idle.
            self.bytes = Vec::new();
            self.entries = VecDeque::new();
        } else if self.bytes.len() > max_size + max_size / 2 {
            self.compact();
            self.bytes.shrink_to(max_size + max_size / 2);
        }
    }

    /// Adds a field as the newest entry, evicting the oldest ones to make room; a field
    /// larger than the whole table empties it and is not added (section 4.4).
    pub fn insert(&mut self, name: &[u8], value: &[u8]) {
        let entry_size = name.len() + value.len() + ENTRY_OVERHEAD;
        if entry_size > self.max_size {
            self.evict_to(0);
            return;
        }
        self.evict_to(self.max_size - entry_size);
        let len = name.len() + value.len();
        if self.bytes.len() + len > self.max_size + self.max_size / 2 && self.start > 0 {
            self.compact();
        }
        let offset = self.bytes.len();
        self.bytes.extend_from_slice(name);
        self.bytes.extend_from_slice(value);
        self.entries.push_back(Entry {
            // The table's size bounds every offset: max_size is a u32 setting.
            offset: offset as u32,
            name_len: name.len() as u32,
            value_len: value.len() as u32,
        });
        self.size += entry_size;
    }

    /// Evicts the oldest entries until the table's size is at most `size`.
    fn evict_to(&mut self, size: usize) {
        while self.size > size {
            let Some(old) = self.entries.pop_front() else {
                break;
            };
            self.size -= (old.name_len + old.value_len) as usize + ENTRY_OVERHEAD;
        }
        match self.entries.front() {
            Some(oldest) => self.start = oldest.offset as usize,
            None => {
                self.bytes.clear();
                self.start = 0;
            }
        }
    }

    /// Moves the live entries' bytes to the front of the buffer.
    fn compact(&mut self) {
        let start = self.start;
        self.bytes.drain(..start);
        for entry in &mut self.entries {
            entry.offset -= start as u32;
        }
        self.start = 0;
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    #[test]
    fn indexes_start_at_one_and_end_at_61() {
        assert_eq!(static_entry(0), None);
        assert_eq!(static_entry(2), Some((&b":method"[..], &b"GET"[..])));
        assert_eq!(static_entry(8), Some((&b":status"[..], &b"200"[..])));
        assert_eq!(static_entry(61), Some((&b"www-authenticate"[..], &b""[..])));
        assert_eq!(static_entry(62), None);
    }

    /// The table against Python's `hpack` (python-hyper's, which the `h2` package uses),
    /// an independent copy of Appendix A.
    #[test]
    fn the_static_table_is_python_hpacks() {
        let script = "from hpack.table import HeaderTable\n\
                      for n, v in HeaderTable.STATIC_TABLE:\n    print(n.hex(), v.hex())";
        let out = Command::new("python3").args(["-c", script]).output();
        let found = out.as_ref().is_ok_and(|o| o.status.success());
        if !terminus_testkit::runs_here(
            terminus_testkit::Need::PythonPackages,
            found,
            "no Python `hpack` package (pip install h2)",
        ) {
            return;
        }
        let text = String::from_utf8(out.unwrap().stdout).unwrap();
        let theirs: Vec<(Vec<u8>, Vec<u8>)> = text
            .lines()
            .map(|l| {
                let (n, v) = l.split_once(' ').unwrap();
                (hex(n), hex(v))
            })
            .collect();
        let ours: Vec<(Vec<u8>, Vec<u8>)> = STATIC
            .iter()
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn static_name_index_is_the_first_index_with_that_name() {
        for (i, (name, _)) in STATIC.iter().enumerate() {
            let first = STATIC.iter().position(|(n, _)| n == name).unwrap() as u32 + 1;
            assert_eq!(static_name_index(name), Some(first), "{i}");
        }
        assert_eq!(static_name_index(b"x-forwarded-for"), None);
        assert_eq!(static_name_index(b"Server"), None, "names are lower case");
    }

    /// RFC 7541 section 4.4: an entry larger than the table empties it; sizes count the
    /// 32 bytes of overhead; the oldest goes first.
    #[test]
    fn the_oldest_entries_are_evicted_first_and_a_too_large_one_empties_the_table() {
        let mut table = DynamicTable::new(100);
        table.insert(b"a", b"1"); // 34
        table.insert(b"bb", b"22"); // 36
        assert_eq!(table.size(), 70);
        assert_eq!(table.get(0), Some((&b"bb"[..], &b"22"[..])));
        assert_eq!(table.get(1), Some((&b"a"[..], &b"1"[..])));
        assert_eq!(table.get(2), None);
        table.insert(b"ccc", b""); // 35: evicts "a"
        assert_eq!(table.len(), 2);
        assert_eq!(table.size(), 71);
        assert_eq!(table.get(1), Some((&b"bb"[..], &b"22"[..])));
        table.insert(&[b'x'; 60], b"123456789"); // 101 > 100
        assert!(table.is_empty());
        assert_eq!(table.size(), 0);
        table.insert(b"d", b"4");
        table.set_max_size(33);
        assert!(table.is_empty(), "a smaller maximum evicts");
        assert_eq!(table.heap_bytes(), 0, "an emptied table holds no memory");
    }

    proptest::proptest! {
        /// Against a model that keeps each entry on its own: same entries in the same
        /// order, same size, through insertions and size changes; the shared buffer
        /// stays within one and a half times the table's size.
        #[test]
        fn the_table_matches_a_plain_model(
            ops in proptest::collection::vec(
                (
                    0u8..10,
                    proptest::collection::vec(proptest::num::u8::ANY, 0..40),
                    proptest::collection::vec(proptest::num::u8::ANY, 0..80),
                    0usize..400,
                ),
                0..200,
            )
        ) {
            use proptest::prelude::*;
            let mut table = DynamicTable::new(256);
            let mut model: VecDeque<(Vec<u8>, Vec<u8>)> = VecDeque::new();
            let mut max = 256usize;
            let size = |m: &VecDeque<(Vec<u8>, Vec<u8>)>| {
                m.iter().map(|(n, v)| n.len() + v.len() + 32).sum::<usize>()
            };
            for (kind, name, value, new_max) in ops {
                // One size change in ten operations.
                if kind == 0 {
                    max = new_max;
                    table.set_max_size(new_max);
                } else {
                    table.insert(&name, &value);
                    model.push_front((name, value));
                }
                while size(&model) > max {
                    model.pop_back();
                }
                prop_assert_eq!(table.len(), model.len());
                prop_assert_eq!(table.size(), size(&model));
                for (i, (n, v)) in model.iter().enumerate() {
                    prop_assert_eq!(table.get(i), Some((&n[..], &v[..])));
                }
                prop_assert!(table.bytes.len() <= max + max / 2);
            }
        }
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }
}
