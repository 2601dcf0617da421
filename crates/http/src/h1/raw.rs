//! A message head kept as it came, for a proxy that passes most of it on unchanged: its
//! bytes and where each field lies in them, found by the one `httparse` pass that parsed
//! it. Writing the fields out again from here keeps their order, spelling and duplicates
//! and costs a copy, where a `HeaderMap` costs a hash and an entry per field to build
//! and a walk to encode (hyper keeps the same things for the same reason, as its
//! `OriginalHeaderOrder` and `HeaderCaseMap` extensions).
//!
//! [`Fields`] reads either representation by name, so that framing, keep-alive and
//! `Connection` are decided by the same code whichever a message is held in.

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::h1::head::MAX_HEADERS;

/// A parsed head's bytes (request or status line, fields, the blank line) and its fields'
/// places in them. Fields are taken out by marking them ([`Fields::remove_if`]): the
/// bytes are never edited, and what is written is what was read, less what was taken out.
///
/// The places ride in the same allocation as the bytes, after them (a head's one copy
/// cost one allocation before heads were kept, and a per-request allocation more is what
/// `tests/allocations.rs` counts): four little-endian `u32`s a field (name start and end,
/// value start and end), then a byte a field, its name's number in [`KNOWN`].
#[derive(Clone, Debug)]
pub struct RawHead {
    buf: Bytes,
    /// The head's length: where the places begin in `buf`.
    len: u32,
    /// How many fields (at most [`MAX_HEADERS`]).
    count: u8,
    /// Which of [`KNOWN`] the head has (bit `id - 1`), removed ones included.
    present: u32,
    /// Which fields are taken out (bit `i`).
    removed: u128,
}

/// Where one field's name and value lie in the head.
#[derive(Clone, Copy, Debug)]
struct Span {
    name: (u32, u32),
    value: (u32, u32),
    /// Its name's place in [`KNOWN`] plus one; 0 for any other name.
    known: u8,
}

/// Bytes a field's place takes after the head: four `u32`s and its known number.
const PLACE: usize = 17;

/// A field's place from its sixteen bytes and its known number.
#[inline]
fn span(place: &[u8], known: u8) -> Span {
    let n = |k: usize| u32::from_le_bytes(place[4 * k..4 * k + 4].try_into().unwrap_or_default());
    Span {
        name: (n(0), n(1)),
        value: (n(2), n(3)),
        known,
    }
}

/// Names fields are looked up by for every message (framing, connection management, the
/// proxy's edits, the server's own fields). A head notes which of them it has and where
/// as it is made, each name compared once: looking one up is then a bit test and a scan
/// for its number, where comparing names would cost a pass over every field each time.
const KNOWN: [&str; 16] = [
    "host",
    "connection",
    "content-length",
    "transfer-encoding",
    "te",
    "upgrade",
    "keep-alive",
    "proxy-connection",
    "expect",
    "date",
    "server",
    "alt-svc",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "forwarded",
];

/// The longest name in [`KNOWN`], plus one.
const KNOWN_LENGTHS: usize = 18;

/// [`KNOWN`]'s numbers (place plus one) by their names' length, two at most per length:
/// a name is compared with those of its length only.
const BY_LENGTH: [[u8; 2]; KNOWN_LENGTHS] = {
    let mut table = [[0u8; 2]; KNOWN_LENGTHS];
    let mut i = 0;
    while i < KNOWN.len() {
        let len = KNOWN[i].len();
        let slot = if table[len][0] == 0 { 0 } else { 1 };
        // A third name of one length would need a wider table: refused at compile time.
        assert!(table[len][slot] == 0);
        table[len][slot] = i as u8 + 1;
        i += 1;
    }
    table
};

/// `name`'s place in [`KNOWN`] plus one, 0 if it is none of them (any case). `name` holds
/// no CR (httparse's and `HeaderName`'s grammar), which [`same_name`] relies on.
#[inline]
fn known(name: &[u8]) -> u8 {
    let Some(ids) = BY_LENGTH.get(name.len()) else {
        return 0;
    };
    for &id in ids {
        if id > 0 && same_name(name, KNOWN[id as usize - 1].as_bytes()) {
            return id;
        }
    }
    0
}

/// Whether `name` is `lower` (lower-case letters and dashes, as [`KNOWN`]'s) in any case,
/// a word at a time: setting bit 5 folds an upper-case letter onto its lower case and
/// leaves a lower-case letter and a dash as they are; the one other byte it folds onto
/// either is CR (onto the dash), which no field name or value httparse accepts holds. Words overlap
/// rather than loop over a short tail. (A byte-wise `eq_ignore_ascii_case` cost ~14
/// instructions a byte.)
#[inline]
fn same_name(name: &[u8], lower: &[u8]) -> bool {
    let n = name.len();
    if n != lower.len() {
        return false;
    }
    match n {
        0..=3 => name.iter().zip(lower).all(|(a, b)| a | 0x20 == *b),
        4..=7 => {
            let w = |s: &[u8], at: usize| fold(&s[at..at + 4]);
            w(name, 0) == w(lower, 0) && w(name, n - 4) == w(lower, n - 4)
        }
        _ => {
            let w = |s: &[u8], at: usize| fold(&s[at..at + 8]);
            (0..n - 8).step_by(8).all(|at| w(name, at) == w(lower, at))
                && w(name, n - 8) == w(lower, n - 8)
        }
    }
}

/// Four or eight bytes as a word with bit 5 of each set.
#[inline]
fn fold(bytes: &[u8]) -> u64 {
    match bytes.len() {
        4 => u64::from(u32::from_le_bytes(bytes.try_into().unwrap_or_default()) | 0x2020_2020),
        _ => u64::from_le_bytes(bytes.try_into().unwrap_or_default()) | 0x2020_2020_2020_2020,
    }
}

/// Whether the field at `s` in `bytes` is named `name` (lower case), whose number in
/// [`KNOWN`] is `id` (0: none): a known name by its number, another by comparing.
#[inline]
fn is_named(bytes: &[u8], s: &Span, id: u8, name: &[u8]) -> bool {
    match id {
        0 => s.known == 0 && bytes[s.name.0 as usize..s.name.1 as usize].eq_ignore_ascii_case(name),
        id => s.known == id,
    }
}

/// Whether `name` (a field's name, or a token of its value: no CR) is `lower`, a name of
/// lower-case letters and dashes, in any case, a word at a time rather than a byte: for
/// names known at compile time (a proxy's lists of fields).
#[inline]
pub fn is_name(name: &[u8], lower: &'static str) -> bool {
    debug_assert!(lower.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'));
    same_name(name, lower.as_bytes())
}

// Removals are gathered in a u128 before they are marked (see `mark_removed`).
const _: () = assert!(MAX_HEADERS <= 128);

impl RawHead {
    /// The head `parsed` with the `fields` httparse found in it (its slices point into
    /// it), copied once. `None` if a field is not inside it.
    pub(crate) fn new(fields: &[httparse::Header<'_>], parsed: &[u8]) -> Option<Self> {
        let base = parsed.as_ptr() as usize;
        let place = |s: &[u8]| -> Option<(u32, u32)> {
            let at = (s.as_ptr() as usize).checked_sub(base)?;
            let end = at + s.len();
            (end <= parsed.len()).then_some((u32::try_from(at).ok()?, u32::try_from(end).ok()?))
        };
        let mut buf = Vec::with_capacity(parsed.len() + fields.len() * PLACE);
        buf.extend_from_slice(parsed);
        let mut present = 0;
        for f in fields {
            let (name, value) = (place(f.name.as_bytes())?, place(f.value)?);
            for n in [name.0, name.1, value.0, value.1] {
                buf.extend_from_slice(&n.to_le_bytes());
            }
        }
        for f in fields {
            let known = known(f.name.as_bytes());
            if known > 0 {
                present |= 1 << (known - 1);
            }
            buf.push(known);
        }
        Some(RawHead {
            buf: Bytes::from(buf),
            len: u32::try_from(parsed.len()).ok()?,
            count: u8::try_from(fields.len()).ok()?,
            present,
            removed: 0,
        })
    }

    /// The head's bytes as they came, first line and blank line included.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len as usize]
    }

    #[inline]
    fn slice(&self, (at, end): (u32, u32)) -> &[u8] {
        &self.buf[at as usize..end as usize]
    }

    /// The fields' places: sixteen bytes each.
    #[inline]
    fn places(&self) -> &[u8] {
        let at = self.len as usize;
        &self.buf[at..at + self.count as usize * 16]
    }

    /// The fields' names' numbers in [`KNOWN`], a byte each.
    #[inline]
    fn knowns(&self) -> &[u8] {
        let at = self.len as usize + self.count as usize * 16;
        &self.buf[at..at + self.count as usize]
    }

    /// The fields not taken out, with their numbers.
    #[inline]
    fn spans(&self) -> impl Iterator<Item = (usize, Span)> + '_ {
        self.places()
            .chunks_exact(16)
            .zip(self.knowns())
            .enumerate()
            .filter(|(i, _)| self.removed & (1 << i) == 0)
            .map(|(i, (place, &known))| (i, span(place, known)))
    }

    /// The fields not taken out, as `(name, value)` in the order and case they came in.
    #[inline]
    pub fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.spans()
            .map(|(_, s)| (self.slice(s.name), self.slice(s.value)))
    }

    /// Whether a field `name` is there and not taken out.
    #[inline]
    pub fn contains(&self, name: &HeaderName) -> bool {
        self.spans_named(name.clone()).next().is_some()
    }

    /// Takes out every field `name`.
    #[inline]
    pub fn remove(&mut self, name: &HeaderName) {
        let picked: u128 = self
            .spans_named(name.clone())
            .fold(0, |picked, (i, _)| picked | 1 << i);
        self.removed |= picked;
    }

    /// Whether the known name `id` (0: not a known one) is one the head never had.
    #[inline]
    fn absent(&self, id: u8) -> bool {
        id > 0 && self.present & (1 << (id - 1)) == 0
    }

    /// The fields named `name` not taken out, with their numbers: a known name's by its
    /// number (a byte a field), another's by comparing names.
    #[inline]
    fn spans_named(&self, name: HeaderName) -> impl Iterator<Item = (usize, Span)> + '_ {
        let id = known(name.as_str().as_bytes());
        // A known name the head never had: nothing to look through.
        let knowns = if self.absent(id) {
            &[][..]
        } else {
            self.knowns()
        };
        knowns
            .iter()
            .enumerate()
            .filter(move |&(i, &k)| k == id && self.removed & (1 << i) == 0)
            .map(|(i, &k)| (i, span(&self.places()[i * 16..i * 16 + 16], k)))
            .filter(move |(_, s)| id > 0 || is_named(&self.buf, s, id, name.as_str().as_bytes()))
    }

    /// [`Fields::remove_if`]: the picked fields are marked, so that `doomed` reads the
    /// head as it was (`Connection` while `Connection` is taken out).
    fn mark_removed(&mut self, doomed: impl Fn(&Self, &[u8]) -> bool) {
        let picked: u128 = self
            .spans()
            .filter(|(_, s)| doomed(self, self.slice(s.name)))
            .fold(0, |picked, (i, _)| picked | 1 << i);
        self.removed |= picked;
    }

    /// Appends the fields not taken out, `name: value` lines as they came.
    pub fn encode_fields(&self, out: &mut Vec<u8>) {
        for (name, value) in self.fields() {
            out.extend_from_slice(name);
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
    }

    /// The fields not taken out, as a map (for what needs one: HTTP/2, an upgrade's
    /// checks). The values share the head's bytes. `None` if a name or value is not
    /// valid in a map, which httparse's grammar (tokens for names; tab, space, visible
    /// ASCII and obs-text for values) rules out.
    pub fn to_header_map(&self) -> Option<HeaderMap> {
        let mut map = HeaderMap::with_capacity(self.count as usize + SPARE_FIELDS);
        for (_, s) in self.spans() {
            let (at, end) = s.value;
            map.append(
                HeaderName::from_bytes(self.slice(s.name)).ok()?,
                HeaderValue::from_maybe_shared(self.buf.slice(at as usize..end as usize)).ok()?,
            );
        }
        Some(map)
    }
}

/// Room for the fields a proxy adds to a parsed head (forwarding, framing), so that
/// adding them does not grow the map.
const SPARE_FIELDS: usize = 6;

/// A message's fields read by name and taken out, whether held in a map or as bytes
/// ([`RawHead`]): the rules that edit a head are written once, for both.
pub trait Fields {
    /// Every value of the field `name`, in order.
    fn values_of(&self, name: HeaderName) -> impl Iterator<Item = &[u8]>;

    /// Takes out every field that `doomed` picks by its name (lower case in a map, as
    /// sent in a [`RawHead`]), `doomed` being asked of the fields as they were before
    /// any went.
    fn remove_if(&mut self, doomed: impl Fn(&Self, &[u8]) -> bool);
}

impl Fields for HeaderMap {
    #[inline]
    fn values_of(&self, name: HeaderName) -> impl Iterator<Item = &[u8]> {
        self.get_all(name).into_iter().map(HeaderValue::as_bytes)
    }

    fn remove_if(&mut self, doomed: impl Fn(&Self, &[u8]) -> bool) {
        // A look at each name, a removal (a hash and a probe) only for those picked:
        // usually none or one or two.
        let picked: Vec<HeaderName> = self
            .keys()
            .filter(|name| doomed(self, name.as_str().as_bytes()))
            .cloned()
            .collect();
        for name in picked {
            self.remove(name);
        }
    }
}

/// A response's fields held as bytes beside its map (a proxied upstream's, already
/// edited for the client), as a response extension: the HTTP/1.1 writer sends them
/// before the map's, so a head that passes through is never built into a map.
#[derive(Clone, Debug)]
pub struct PassedFields(pub RawHead);

impl Fields for RawHead {
    #[inline]
    fn values_of(&self, name: HeaderName) -> impl Iterator<Item = &[u8]> {
        self.spans_named(name).map(|(_, s)| self.slice(s.value))
    }

    fn remove_if(&mut self, doomed: impl Fn(&Self, &[u8]) -> bool) {
        self.mark_removed(doomed);
    }
}

/// Whether a value is text, as `HeaderValue::to_str` has it: tab and visible ASCII.
#[inline]
pub(crate) fn is_text(value: &[u8]) -> bool {
    value
        .iter()
        .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header;

    fn raw(text: &str) -> RawHead {
        let mut buf = text.as_bytes().to_vec();
        crate::h1::head::parse_response_head(&mut buf)
            .unwrap()
            .unwrap()
            .fields
    }

    /// Every token spelling of a known name is found, in any case, and no other token is
    /// taken for one.
    #[test]
    fn known_names_are_found_in_any_case_and_only_they() {
        for (i, name) in KNOWN.iter().enumerate() {
            assert_eq!(known(name.as_bytes()), i as u8 + 1);
            assert_eq!(known(name.to_ascii_uppercase().as_bytes()), i as u8 + 1);
        }
        // Every one-byte change of a known name into another token byte is another name.
        let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        for name in KNOWN {
            for at in 0..name.len() {
                for b in (0..=255u8).filter(|&b| tchar(b)) {
                    let mut other = name.as_bytes().to_vec();
                    if other[at].eq_ignore_ascii_case(&b) {
                        continue;
                    }
                    other[at] = b;
                    assert_eq!(known(&other), 0, "{:?}", String::from_utf8_lossy(&other));
                }
            }
        }
    }

    #[test]
    fn fields_come_out_as_they_came_in_less_the_removed() {
        let mut head =
            raw("HTTP/1.1 200 OK\r\nX-A: 1\r\nConnection: X-B\r\nx-b: 2\r\nX-A:  3\r\n\r\n");
        assert_eq!(
            head.values_of(HeaderName::from_static("x-a"))
                .collect::<Vec<_>>(),
            [&b"1"[..], b"3"]
        );
        head.remove_if(|h, name| {
            name.eq_ignore_ascii_case(b"connection")
                || crate::h1::tokens(h, header::CONNECTION)
                    .any(|t| t.as_bytes().eq_ignore_ascii_case(name))
        });
        let mut out = Vec::new();
        head.encode_fields(&mut out);
        assert_eq!(out, b"X-A: 1\r\nX-A: 3\r\n");
        assert!(!head.contains(&header::CONNECTION));
        let map = head.to_header_map().unwrap();
        assert_eq!(map.get_all("x-a").iter().count(), 2);
        assert_eq!(map.len(), 2);
    }
}
