//! What an HTTP/2 client did that its connection refused or ended on, as the metric
//! labels the responder counts them under.

/// What an HTTP/2 client did that its connection refused or ended on.
#[derive(Clone, Copy, Debug)]
pub enum Http2Trouble {
    /// The connection ended with this error code in its GOAWAY.
    Connection(crate::h2::ErrorCode),
    /// A request refused by the codec itself.
    Refused(super::state::Refusal),
    /// A stream reset for a rule it broke (flow control, content-length, state).
    StreamReset,
    /// A stream the client reset.
    ClientReset,
}

impl Http2Trouble {
    /// Each kind's metric label, in [`Http2Trouble::index`] order.
    pub const NAMES: [&'static str; 12] = [
        "goaway_protocol_error",
        "goaway_flow_control_error",
        "goaway_frame_size_error",
        "goaway_compression_error",
        "goaway_enhance_your_calm",
        "goaway_stream_closed",
        "goaway_other",
        "stream_malformed",
        "stream_refused",
        "stream_too_large",
        "stream_reset",
        "client_reset",
    ];

    /// Where this kind's label is in [`Http2Trouble::NAMES`].
    pub fn index(self) -> usize {
        use super::state::Refusal;
        use crate::h2::ErrorCode;
        match self {
            Self::Connection(ErrorCode::ProtocolError) => 0,
            Self::Connection(ErrorCode::FlowControlError) => 1,
            Self::Connection(ErrorCode::FrameSizeError) => 2,
            Self::Connection(ErrorCode::CompressionError) => 3,
            Self::Connection(ErrorCode::EnhanceYourCalm) => 4,
            Self::Connection(ErrorCode::StreamClosed) => 5,
            Self::Connection(_) => 6,
            Self::Refused(Refusal::Malformed) => 7,
            Self::Refused(Refusal::TooManyStreams) => 8,
            Self::Refused(Refusal::TooLarge) => 9,
            Self::StreamReset => 10,
            Self::ClientReset => 11,
        }
    }
}
