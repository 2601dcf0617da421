//! The field block decoder (RFC 7541 sections 3 and 6): a whole block (a HEADERS frame's
//! fragment and its CONTINUATIONs, joined) in, fields out one at a time to the caller,
//! borrowed where they lie rather than collected.
//!
//! A literal string comes out of the block itself; a Huffman-coded one is decoded into a
//! scratch buffer the caller lends (the connection's, so nothing stays allocated between
//! requests); an indexed field comes out of the table. The caller copies what it keeps.
//!
//! A block is always decoded to its end, even when the caller has refused the request, so
//! that both ends' tables stay in step: a stream error must not become a connection one.

use super::table::{self, DynamicTable, ENTRY_OVERHEAD, FIRST_DYNAMIC};
use super::{huffman, integer, HpackError};

/// One decoded field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field<'a> {
    /// The name, as sent: checking it (lower case, no pseudo-field after a regular one)
    /// is HTTP's job, not HPACK's.
    pub name: &'a [u8],
    /// The value, as sent.
    pub value: &'a [u8],
    /// Sent as "never indexed" (section 6.2.3): a proxy must forward it the same way.
    pub sensitive: bool,
}

/// How a block ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Every field was handed to the caller.
    Complete,
    /// The field list grew past the caller's limit (counted as RFC 9113 section 6.5.2
    /// counts it, 32 bytes more per field); the fields after the limit were decoded, to
    /// keep the table in step, but not handed over. HTTP's answer is 431.
    Oversized,
}

/// The decoder of one connection: the peer's dynamic table and the limit we set on it.
#[derive(Debug)]
pub struct Decoder {
    table: DynamicTable,
    /// Our SETTINGS_HEADER_TABLE_SIZE: the largest size the peer may give its table.
    settings_max: usize,
}

/// Where a decoded string lies until the field is handed over.
enum Str<'b> {
    Block(&'b [u8]),
    Static(&'static [u8]),
    Scratch(usize, usize),
    Table(usize),
}

impl Decoder {
    /// A decoder whose peer may use a table of up to `settings_max` bytes (the
    /// SETTINGS_HEADER_TABLE_SIZE we announce; 4096 unless we announce another).
    pub fn new(settings_max: usize) -> Self {
        Self {
            table: DynamicTable::new(settings_max),
            settings_max,
        }
    }

    /// The peer's table, for tests and memory accounting.
    pub fn table(&self) -> &DynamicTable {
        &self.table
    }

    /// Decodes the field block `block`, handing each field to `each` in order.
    /// `max_list_size` is the most the caller takes (see [`Decoded::Oversized`]); a list
    /// more than twice that is refused outright ([`HpackError::TooLarge`]): decoding it
    /// would cost the server work out of proportion to the block's bytes, as an entry of
    /// the table referenced by a one-byte index may be kilobytes. `scratch` is cleared and
    /// used for Huffman-coded strings.
    pub fn decode<F>(
        &mut self,
        block: &[u8],
        max_list_size: usize,
        scratch: &mut Vec<u8>,
        mut each: F,
    ) -> Result<Decoded, HpackError>
    where
        F: FnMut(Field<'_>),
    {
        let mut pos = 0;
        let mut list_size = 0usize;
        let mut fields_seen = false;
        while pos < block.len() {
            scratch.clear();
            let first = block[pos];
            if first & 0x80 != 0 {
                // Indexed field (section 6.1).
                let (index, used) = integer::decode(&block[pos..], 7)?;
                pos += used;
                let (name, value) = self.entry(index)?;
                fields_seen = true;
                let field = Field {
                    name,
                    value,
                    sensitive: false,
                };
                hand_over(field, &mut list_size, max_list_size, &mut each)?;
                continue;
            }
            if first & 0xe0 == 0x20 {
                // Dynamic table size update (section 6.3): only before the first field
                // (section 4.2), and never above what we announced.
                let (size, used) = integer::decode(&block[pos..], 5)?;
                pos += used;
                if fields_seen {
                    return Err(HpackError::LateSizeUpdate);
                }
                if size as usize > self.settings_max {
                    return Err(HpackError::SizeUpdateTooLarge);
                }
                self.table.set_max_size(size as usize);
                continue;
            }
            // A literal (sections 6.2.1-6.2.3): with incremental indexing (01), never
            // indexed (0001) or without indexing (0000).
            let (indexing, sensitive, prefix) = if first & 0xc0 == 0x40 {
                (true, false, 6)
            } else {
                (false, first & 0x10 != 0, 4)
            };
            let (name_index, used) = integer::decode(&block[pos..], prefix)?;
            pos += used;
            let name = if name_index == 0 {
                read_string(block, &mut pos, scratch)?
            } else if name_index < FIRST_DYNAMIC {
                Str::Static(self.entry_static(name_index)?)
            } else {
                let i = (name_index - FIRST_DYNAMIC) as usize;
                let (name, _) = self.table.get(i).ok_or(HpackError::InvalidIndex)?;
                if indexing {
                    // Inserting may evict the entry the name comes from (section 4.4):
                    // copy it out of the table first.
                    let start = scratch.len();
                    scratch.extend_from_slice(name);
                    Str::Scratch(start, scratch.len())
                } else {
                    Str::Table(i)
                }
            };
            let value = read_string(block, &mut pos, scratch)?;
            fields_seen = true;
            let field = |name, value| Field {
                name,
                value,
                sensitive,
            };
            if indexing {
                // The name and value never borrow the table here (see above), so
                // that it can take them.
                let name = resolve(name, scratch, None);
                let value = resolve(value, scratch, None);
                hand_over(field(name, value), &mut list_size, max_list_size, &mut each)?;
                self.table.insert(name, value);
            } else {
                let name = resolve(name, scratch, Some(&self.table));
                let value = resolve(value, scratch, Some(&self.table));
                hand_over(field(name, value), &mut list_size, max_list_size, &mut each)?;
            }
        }
        Ok(if list_size > max_list_size {
            Decoded::Oversized
        } else {
            Decoded::Complete
        })
    }

    /// The field at HPACK index `index`, in either table.
    fn entry(&self, index: u32) -> Result<(&[u8], &[u8]), HpackError> {
        if index < FIRST_DYNAMIC {
            return table::static_entry(index).ok_or(HpackError::InvalidIndex);
        }
        self.table
            .get((index - FIRST_DYNAMIC) as usize)
            .ok_or(HpackError::InvalidIndex)
    }

    fn entry_static(&self, index: u32) -> Result<&'static [u8], HpackError> {
        table::static_entry(index)
            .map(|(name, _)| name)
            .ok_or(HpackError::InvalidIndex)
    }
}

/// Counts `field` into the list's size and hands it to the caller while the list is
/// within `max` (see [`Decoder::decode`]).
fn hand_over<F: FnMut(Field<'_>)>(
    field: Field<'_>,
    list_size: &mut usize,
    max: usize,
    each: &mut F,
) -> Result<(), HpackError> {
    *list_size += field.name.len() + field.value.len() + ENTRY_OVERHEAD;
    if *list_size > max.saturating_mul(2) {
        return Err(HpackError::TooLarge);
    }
    if *list_size <= max {
        each(field);
    }
    Ok(())
}

/// The bytes of a decoded string; `table` is `None` when the string cannot be in it.
fn resolve<'a>(s: Str<'a>, scratch: &'a [u8], table: Option<&'a DynamicTable>) -> &'a [u8] {
    match s {
        Str::Block(b) | Str::Static(b) => b,
        Str::Scratch(from, to) => &scratch[from..to],
        Str::Table(i) => table
            .and_then(|t| t.get(i))
            .map_or(&[][..], |(name, _)| name),
    }
}

/// A string literal (section 5.2) at `pos`: borrowed from the block when sent as is,
/// decoded into `scratch` when Huffman-coded.
fn read_string<'b>(
    block: &'b [u8],
    pos: &mut usize,
    scratch: &mut Vec<u8>,
) -> Result<Str<'b>, HpackError> {
    let rest = &block[*pos..];
    let huffman_coded = rest.first().ok_or(HpackError::Truncated)? & 0x80 != 0;
    let (len, used) = integer::decode(rest, 7)?;
    let end = used
        .checked_add(len as usize)
        .filter(|&end| end <= rest.len())
        .ok_or(HpackError::Truncated)?;
    let bytes = &rest[used..end];
    *pos += end;
    if !huffman_coded {
        return Ok(Str::Block(bytes));
    }
    let start = scratch.len();
    huffman::decode(bytes, scratch)?;
    Ok(Str::Scratch(start, scratch.len()))
}

#[cfg(test)]
mod tests;
