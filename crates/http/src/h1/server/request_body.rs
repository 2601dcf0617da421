//! Feeding a request's body to its responder: the connection decodes the next frame
//! from its read buffer, reading the socket only when the responder has taken the
//! previous frame, so a client never gets more than a frame and a read ahead of the
//! responder (back-pressure reaches it through TCP).
//!
//! While the responder still wants the body after it has answered (a proxied upstream
//! that keeps reading: streaming uploads, gRPC-Web), the body keeps streaming to it as
//! the response goes out (full duplex, see `conn`); otherwise what it left unread is
//! dropped with the connection, never mistaken for the next request.

use std::time::Duration;

use hyper::body::Frame;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::body::{Feed, Piece};
use crate::h1::{Decoded, Decoder};
use std::io;

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Feeds the body `decoder` delimits, from `buf` and then from `read`, into `feed` until
/// it ends, fails, or the responder drops it. A client that asked for `100 Continue` gets
/// it on `continue_to` when the body is first wanted and none of it has arrived. Each
/// read must bring bytes within `stall`.
pub(super) async fn feed<R, W>(
    read: &mut R,
    mut continue_to: Option<&mut W>,
    buf: &mut Vec<u8>,
    decoder: &mut Decoder,
    feed: &Feed,
    stall: Duration,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        // The permit first: nothing is read or decoded for a responder that is not
        // asking, and a frame decoded is a frame delivered (this future may be dropped
        // at any await, and the decoder's state must match what the responder got).
        let Ok(permit) = feed.reserve().await else {
            return;
        };
        let piece = loop {
            match decoder.decode(buf) {
                Ok(Some(Decoded::Data(data))) => break Piece::Frame(Frame::data(data)),
                Ok(Some(Decoded::Trailers(t))) => break Piece::Frame(Frame::trailers(t)),
                Ok(Some(Decoded::End)) => break Piece::End,
                Err(malformed) => {
                    break Piece::Failed(io::Error::new(io::ErrorKind::InvalidData, malformed.0))
                }
                Ok(None) => {}
            }
            if let Some(to) = continue_to.take() {
                if let Err(e) = send_continue(to, stall).await {
                    break Piece::Failed(e);
                }
            }
            buf.reserve(16 * 1024);
            match tokio::time::timeout(stall, read.read_buf(buf)).await {
                Ok(Ok(0)) => break Piece::Failed(io::ErrorKind::UnexpectedEof.into()),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => break Piece::Failed(e),
                Err(_) => {
                    let e = io::Error::new(io::ErrorKind::TimedOut, "request body timeout");
                    break Piece::Failed(e);
                }
            }
        };
        let last = !matches!(piece, Piece::Frame(_));
        permit.send(piece);
        // Some of the body came unasked: the client is not waiting for the interim answer.
        continue_to = None;
        if last {
            return;
        }
    }
}

async fn send_continue<W: AsyncWrite + Unpin>(io: &mut W, stall: Duration) -> io::Result<()> {
    let write = async {
        io.write_all(CONTINUE).await?;
        io.flush().await
    };
    tokio::time::timeout(stall, write)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "client stopped reading"))?
}
