//! A request's fields as HTTP/2 carries them (RFC 9113 section 8): decoded into one
//! buffer, checked as they come, and the pseudo-fields kept apart from the rest.
//!
//! Everything section 8 calls malformed is refused here, and a malformed request costs
//! only its stream (a stream error of type PROTOCOL_ERROR, section 8.1.1): upper-case or
//! empty names, characters a field may not hold, pseudo-fields unknown, repeated, after a
//! regular field or in trailers, the fields HTTP/2 forbids (`connection` and its kin, a
//! `te` other than `trailers`), missing or empty required pseudo-fields, and a
//! `content-length` that is not one number.

use crate::h2::hpack::decoder::Field;

/// The pseudo-fields of a request (section 8.3.1, and RFC 8441's `:protocol`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
enum Pseudo {
    Method,
    Scheme,
    Authority,
    Path,
    Protocol,
}

impl Pseudo {
    fn of(name: &[u8]) -> Option<Self> {
        Some(match name {
            b":method" => Self::Method,
            b":scheme" => Self::Scheme,
            b":authority" => Self::Authority,
            b":path" => Self::Path,
            b":protocol" => Self::Protocol,
            _ => return None,
        })
    }
}

/// Where a name and value lie in [`FieldList::bytes`].
#[derive(Clone, Copy, Debug)]
struct Entry {
    start: u32,
    name_len: u32,
    value_len: u32,
    sensitive: bool,
}

/// A request head or its trailers, as decoded. Reused from one block to the next (its
/// buffers are the connection's), so a request costs no allocation here once warm.
#[derive(Debug, Default)]
pub struct FieldList {
    bytes: Vec<u8>,
    fields: Vec<Entry>,
    pseudo: [Option<(u32, u32)>; 5],
    content_length: Option<u64>,
    /// The first thing found malformed; fields keep being decoded (the HPACK tables must
    /// stay in step) but are no longer kept.
    malformed: Option<&'static str>,
    trailers: bool,
}

/// One regular field of a [`FieldList`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestField<'a> {
    /// The name, lower case.
    pub name: &'a [u8],
    /// The value.
    pub value: &'a [u8],
    /// Sent never-indexed: pass it on the same way.
    pub sensitive: bool,
}

impl FieldList {
    /// Starts a new block: a request head, or trailers.
    pub(crate) fn begin(&mut self, trailers: bool) {
        self.bytes.clear();
        self.fields.clear();
        self.pseudo = [None; 5];
        self.content_length = None;
        self.malformed = None;
        self.trailers = trailers;
    }

    /// Gives the buffers back (an idle connection keeps none).
    pub(crate) fn release(&mut self) {
        *self = Self::default();
    }

    /// Takes a decoded field, checking it.
    pub(crate) fn push(&mut self, field: Field<'_>) {
        if self.malformed.is_some() {
            return;
        }
        if let Err(why) = self.check_and_keep(field) {
            self.malformed = Some(why);
        }
    }

    fn check_and_keep(&mut self, field: Field<'_>) -> Result<(), &'static str> {
        let Field { name, value, .. } = field;
        check_value(value)?;
        if name.first() == Some(&b':') {
            if self.trailers {
                return Err("a pseudo-field in trailers");
            }
            if !self.fields.is_empty() {
                return Err("a pseudo-field after a regular field");
            }
            let which = Pseudo::of(name).ok_or("an unknown pseudo-field")?;
            if self.pseudo[which as usize].is_some() {
                return Err("a pseudo-field twice");
            }
            let start = self.bytes.len() as u32;
            self.bytes.extend_from_slice(value);
            self.pseudo[which as usize] = Some((start, value.len() as u32));
            return Ok(());
        }
        check_name(name)?;
        match name {
            b"connection" | b"proxy-connection" | b"keep-alive" | b"transfer-encoding"
            | b"upgrade" => return Err("a connection-specific field"),
            b"te" if value != b"trailers" => return Err("a te field other than \"trailers\""),
            b"content-length" => {
                let n = parse_length(value).ok_or("a content-length that is not a number")?;
                if self.content_length.is_some_and(|m| m != n) {
                    return Err("two different content-lengths");
                }
                self.content_length = Some(n);
            }
            _ => {}
        }
        let start = self.bytes.len() as u32;
        self.bytes.extend_from_slice(name);
        self.bytes.extend_from_slice(value);
        self.fields.push(Entry {
            start,
            name_len: name.len() as u32,
            value_len: value.len() as u32,
            sensitive: field.sensitive,
        });
        Ok(())
    }

    /// Ends a request head: what made it malformed, if anything. `connect_protocol` is
    /// whether we announced RFC 8441's extended CONNECT.
    pub(crate) fn finish_request(&self, connect_protocol: bool) -> Result<(), &'static str> {
        if let Some(why) = self.malformed {
            return Err(why);
        }
        let method = self.pseudo(Pseudo::Method).ok_or("no :method")?;
        let has = |p| self.pseudo[p as usize].is_some();
        if method == b"CONNECT" {
            if has(Pseudo::Protocol) {
                if !connect_protocol {
                    return Err(":protocol without SETTINGS_ENABLE_CONNECT_PROTOCOL");
                }
                // RFC 8441 section 4: an extended CONNECT names a scheme and a path.
                if !has(Pseudo::Scheme) || !has(Pseudo::Path) || !has(Pseudo::Authority) {
                    return Err("an extended CONNECT without :scheme, :path or :authority");
                }
            } else if has(Pseudo::Scheme) || has(Pseudo::Path) || !has(Pseudo::Authority) {
                // Section 8.5: CONNECT names only its authority.
                return Err("a CONNECT with :scheme or :path, or without :authority");
            }
        } else {
            if has(Pseudo::Protocol) {
                return Err(":protocol on a method other than CONNECT");
            }
            self.pseudo(Pseudo::Scheme).ok_or("no :scheme")?;
            let path = self.pseudo(Pseudo::Path).ok_or("no :path")?;
            let asterisk = path == b"*" && method == b"OPTIONS";
            if path.first() != Some(&b'/') && !asterisk {
                return Err("a :path that is neither absolute nor an OPTIONS *");
            }
        }
        if method.is_empty() || !method.iter().all(|&b| is_token(b)) {
            return Err("a :method that is not a token");
        }
        Ok(())
    }

    /// Ends trailers: what made them malformed, if anything.
    pub(crate) fn finish_trailers(&self) -> Result<(), &'static str> {
        self.malformed.map_or(Ok(()), Err)
    }

    fn pseudo(&self, which: Pseudo) -> Option<&[u8]> {
        let (start, len) = self.pseudo[which as usize]?;
        Some(&self.bytes[start as usize..(start + len) as usize])
    }

    /// `:method`.
    pub fn method(&self) -> &[u8] {
        self.pseudo(Pseudo::Method).unwrap_or_default()
    }

    /// `:scheme`, absent on a plain CONNECT.
    pub fn scheme(&self) -> Option<&[u8]> {
        self.pseudo(Pseudo::Scheme)
    }

    /// `:authority`, if sent.
    pub fn authority(&self) -> Option<&[u8]> {
        self.pseudo(Pseudo::Authority)
    }

    /// `:path`, absent on a plain CONNECT.
    pub fn path(&self) -> Option<&[u8]> {
        self.pseudo(Pseudo::Path)
    }

    /// `:protocol` (RFC 8441), on an extended CONNECT.
    pub fn protocol(&self) -> Option<&[u8]> {
        self.pseudo(Pseudo::Protocol)
    }

    /// The `content-length` sent, if any.
    pub fn content_length(&self) -> Option<u64> {
        self.content_length
    }

    /// The regular fields, in order.
    pub fn fields(&self) -> impl Iterator<Item = RequestField<'_>> {
        self.fields.iter().map(|e| {
            let name = e.start as usize;
            let value = name + e.name_len as usize;
            RequestField {
                name: &self.bytes[name..value],
                value: &self.bytes[value..value + e.value_len as usize],
                sensitive: e.sensitive,
            }
        })
    }
}

/// Section 8.2.1: a name is a token in lower case.
fn check_name(name: &[u8]) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("an empty field name");
    }
    if name.iter().any(u8::is_ascii_uppercase) {
        return Err("an upper-case field name");
    }
    if !name.iter().all(|&b| is_token(b)) {
        return Err("a field name that is not a token");
    }
    Ok(())
}

/// Section 8.2.1: no NUL, CR or LF anywhere, no space or tab at either end.
fn check_value(value: &[u8]) -> Result<(), &'static str> {
    if value.iter().any(|&b| matches!(b, 0 | b'\r' | b'\n')) {
        return Err("NUL, CR or LF in a field value");
    }
    if matches!(value.first(), Some(b' ' | b'\t')) || matches!(value.last(), Some(b' ' | b'\t')) {
        return Err("a field value starting or ending with white space");
    }
    Ok(())
}

/// RFC 9110 section 5.6.2's tchar.
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A content-length: digits only, at most 19 of them (below 2^63).
fn parse_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        value
            .iter()
            .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0')),
    )
}
