//! HPACK (RFC 7541), the field compression of HTTP/2, written for a server: field
//! blocks decoded from the frames' bytes where they lie, responses encoded into the
//! buffer they are sent from. One job a module: [`integer`] (section 5.1), [`huffman`]
//! (section 5.2, Appendix B), [`table`] (the static table and a dynamic one), the
//! [`decoder`] of the client's blocks and the [`encoder`] of our responses (which keeps
//! no table; its module says why).
//!
//! No maintained crate fitted: `hpack` (2015) and its fork `loona-hpack` allocate a
//! `Vec` per field and never Huffman-code, `hpack_codec` is unmaintained since 2019,
//! and the `h2` crate keeps its own private. `loona-hpack` and Python's `hpack` are the
//! independent implementations the decoder and encoder are tested against.

pub mod decoder;
pub mod encoder;
pub mod huffman;
pub mod integer;
pub mod table;

/// What makes a field block undecodable: a COMPRESSION_ERROR for the connection
/// (RFC 9113 section 4.3), since the peer's and our tables no longer agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HpackError {
    /// The block ends inside a representation.
    Truncated,
    /// An integer longer than any this decoder accepts (see [`integer::MAX`]).
    IntegerOverflow,
    /// A Huffman-coded string that is not a valid code: the EOS symbol, padding longer
    /// than 7 bits or not all ones (RFC 7541 section 5.2).
    Huffman,
    /// An index past the end of both tables, or 0.
    InvalidIndex,
    /// A dynamic table size update after a field (RFC 7541 section 4.2).
    LateSizeUpdate,
    /// A dynamic table size update above our SETTINGS_HEADER_TABLE_SIZE.
    SizeUpdateTooLarge,
    /// A field list far past the limit (see [`decoder::Decoder::decode`]).
    TooLarge,
}

impl std::fmt::Display for HpackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Truncated => "a field block that ends inside a representation",
            Self::IntegerOverflow => "an HPACK integer too large to be a length or an index",
            Self::Huffman => "a Huffman-coded string with EOS or bad padding",
            Self::InvalidIndex => "an HPACK index in neither table",
            Self::LateSizeUpdate => "a dynamic table size update after a field",
            Self::SizeUpdateTooLarge => "a dynamic table size update above the announced limit",
            Self::TooLarge => "a field list far larger than the limit",
        })
    }
}

impl std::error::Error for HpackError {}
