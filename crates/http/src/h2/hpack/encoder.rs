//! The field block encoder of a server's responses (RFC 7541 section 6), writing straight
//! into the buffer the frame is sent from.
//!
//! It keeps no dynamic table: every field is a literal without indexing, its name by
//! static index where the static table has it, and `:status` indexed where the static
//! table has the code. That is nginx's choice too (its responses index nothing). What a
//! table would save is bytes on the wire for repeated response fields (`server`,
//! `content-type`, `date`): tens of bytes a response, at the cost of a table per
//! connection held while idle and a lookup per field. A server's responses are small
//! against its bodies; the memory and the lookups are not small against what an idle
//! connection and a request cost here. Strings are Huffman-coded where that is shorter,
//! as nginx, h2o and HAProxy do.
//!
//! The one state: the peer may lower SETTINGS_HEADER_TABLE_SIZE below the 4096 bytes our
//! table may nominally use, and then must be told, at the start of the next block, that
//! ours is no larger (section 4.2); nghttp2's decoder refuses a block that does not.

use super::table::static_name_index;
use super::{huffman, integer};

/// The table size a peer's decoder starts with (RFC 9113 section 6.5.2).
const DEFAULT_TABLE_SIZE: u32 = 4096;

/// The encoder of one connection.
#[derive(Debug)]
pub struct Encoder {
    /// The most our table may hold as the peer's decoder sees it.
    table_size: u32,
    /// A size update owed at the start of the next block.
    update_owed: bool,
}

impl Default for Encoder {
    fn default() -> Self {
        Self {
            table_size: DEFAULT_TABLE_SIZE,
            update_owed: false,
        }
    }
}

impl Encoder {
    /// The peer's SETTINGS_HEADER_TABLE_SIZE took effect: if it is below our table's
    /// size, the next block tells the peer ours is now that small.
    pub fn peer_table_size(&mut self, size: u32) {
        if size < self.table_size {
            self.table_size = size;
            self.update_owed = true;
        }
    }

    /// Starts a block: the size update owed, if any.
    pub fn begin_block(&mut self, out: &mut Vec<u8>) {
        if std::mem::take(&mut self.update_owed) {
            integer::encode(self.table_size, 5, 0x20, out);
        }
    }
}

/// Appends `:status` (indexed for the seven codes the static table has).
pub fn status(code: u16, out: &mut Vec<u8>) {
    let index = match code {
        200 => 8,
        204 => 9,
        206 => 10,
        304 => 11,
        400 => 12,
        404 => 13,
        500 => 14,
        _ => 0,
    };
    if index != 0 {
        out.push(0x80 | index);
        return;
    }
    // A literal without indexing, name `:status` (index 8), three digits.
    let digits = [
        b'0' + (code / 100 % 10) as u8,
        b'0' + (code / 10 % 10) as u8,
        b'0' + (code % 10) as u8,
    ];
    out.push(0x08);
    string(&digits, out);
}

/// Appends a field as a literal without indexing (section 6.2.2). `name` must be lower
/// case, as HTTP/2 requires of every name.
pub fn field(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    literal(name, value, 0x00, out);
}

/// Appends a field as [`field`] does, its value as it is, never Huffman-coded: what a
/// server's hot path writes (HAProxy's choice), where coding each response's `date`,
/// `etag` and `content-type` costs more CPU than the few bytes it saves are worth.
pub fn field_plain(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    match static_name_index(name) {
        Some(index) => integer::encode(index, 4, 0x00, out),
        None => {
            out.push(0x00);
            string(name, out);
        }
    }
    integer::encode(value.len() as u32, 7, 0, out);
    out.extend_from_slice(value);
}

/// Appends a field as never indexed (section 6.2.3): for values an intermediary must not
/// put in a table either (credentials, cookies it was told are sensitive).
pub fn sensitive_field(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    literal(name, value, 0x10, out);
}

fn literal(name: &[u8], value: &[u8], first: u8, out: &mut Vec<u8>) {
    match static_name_index(name) {
        Some(index) => integer::encode(index, 4, first, out),
        None => {
            out.push(first);
            string(name, out);
        }
    }
    string(value, out);
}

/// Appends a string literal (section 5.2), Huffman-coded when that is shorter.
pub fn string(bytes: &[u8], out: &mut Vec<u8>) {
    let coded = huffman::encoded_len(bytes);
    if coded < bytes.len() {
        integer::encode(coded as u32, 7, 0x80, out);
        huffman::encode(bytes, out);
    } else {
        integer::encode(bytes.len() as u32, 7, 0, out);
        out.extend_from_slice(bytes);
    }
}
