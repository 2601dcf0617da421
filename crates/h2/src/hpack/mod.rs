//! HPACK (RFC 7541), the field compression of HTTP/2, written for a server: field
//! blocks decoded from the frames' bytes where they lie, responses encoded into the
//! buffer they are sent from. Built in steps: [`integer`] (section 5.1) and [`table`]'s
//! static table (Appendix A) first; the Huffman code, the dynamic table and the block
//! decoder and encoder follow.

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
}

impl std::fmt::Display for HpackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Truncated => "a field block that ends inside a representation",
            Self::IntegerOverflow => "an HPACK integer too large to be a length or an index",
        })
    }
}

impl std::error::Error for HpackError {}
