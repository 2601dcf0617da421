//! A response body compressed as it streams: each frame of the body beneath goes into
//! the encoder as it comes, and what the encoder has made leaves in chunks of about
//! [`CHUNK`] bytes. When the body beneath has nothing ready (an upstream that sends
//! events now and then), what was written so far is flushed at once, so that compression
//! never holds back a stream's data; a body that is all there (a file) is never flushed
//! before its end, and compresses as well as it can. Trailers pass through after the
//! encoder's end.
//!
//! Windows are kept small (brotli 256 KiB, zstd 256 KiB and its tables 1 MiB at most,
//! gzip's fixed 32 KiB): a server compressing thousands of responses at once (server-sent
//! events hold theirs for their whole life) pays an encoder's memory for each. One poll
//! compresses at most [`INPUT_PER_POLL`] bytes, so that no response holds up the
//! worker's other connections.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::Frame;

use super::memory::Reserved;
use super::{Coding, Levels};
use crate::body::Body;

/// Compressed output is sent in chunks of about this size.
const CHUNK: usize = 16 * 1024;

/// Input compressed in one poll, at most: then the worker's other connections get their
/// turn, however compressible the body (a poll that waited for [`CHUNK`] of output could
/// take a whole file of zeros) and however slow the level.
const INPUT_PER_POLL: usize = 64 * 1024;

/// brotli's window, log2: 256 KiB.
const BROTLI_WINDOW_LOG: u32 = 18;

/// zstd's window, log2: 256 KiB (web pages, scripts and styles are mostly smaller;
/// beyond it a larger window gains a few percent for its memory).
const ZSTD_WINDOW_LOG: u32 = 18;

/// zstd's hash and chain tables, log2 of their entries (4 bytes each) at most: 512 KiB
/// each.
const ZSTD_TABLE_LOG: u32 = 17;

/// One coding's encoder, writing into a buffer the body empties.
enum Encoder {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Brotli(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl Encoder {
    fn new(coding: Coding, levels: Levels, length: Option<u64>) -> io::Result<Encoder> {
        Ok(match coding {
            Coding::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::new(levels.gzip),
            )),
            Coding::Brotli => Encoder::Brotli(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                4096,
                levels.brotli,
                BROTLI_WINDOW_LOG,
            ))),
            Coding::Zstd => {
                let mut e = zstd::stream::write::Encoder::new(Vec::new(), levels.zstd)?;
                e.window_log(ZSTD_WINDOW_LOG)?;
                // Levels above 3 size their match tables past 1 MiB for a stream of
                // unknown length (level 9's are 12 MiB): bounded here, at some ratio.
                if levels.zstd > 3 {
                    e.set_parameter(zstd::stream::raw::CParameter::HashLog(ZSTD_TABLE_LOG))?;
                    e.set_parameter(zstd::stream::raw::CParameter::ChainLog(ZSTD_TABLE_LOG))?;
                }
                // A known length lets zstd size its tables to the input, and says the
                // content size in the frame.
                e.set_pledged_src_size(length)?;
                Encoder::Zstd(e)
            }
        })
    }

    fn output(&mut self) -> &mut Vec<u8> {
        match self {
            Encoder::Gzip(e) => e.get_mut(),
            Encoder::Brotli(e) => e.get_mut(),
            Encoder::Zstd(e) => e.get_mut(),
        }
    }

    fn write(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.write_all(data),
            Encoder::Brotli(e) => e.write_all(data),
            Encoder::Zstd(e) => e.write_all(data),
        }
    }

    /// Makes everything written so far decodable by the client.
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.flush(),
            Encoder::Brotli(e) => e.flush(),
            Encoder::Zstd(e) => e.flush(),
        }
    }

    /// Ends the stream; returns the last of its output.
    fn finish(self) -> io::Result<Vec<u8>> {
        match self {
            Encoder::Gzip(e) => e.finish(),
            Encoder::Brotli(e) => Ok(e.into_inner()),
            Encoder::Zstd(e) => e.finish(),
        }
    }
}

/// A body compressed in one coding as it streams (see the module's doc).
pub struct Compressed {
    coding: Coding,
    levels: Levels,
    /// The length of the body beneath, if known (zstd sizes its tables to it).
    length: Option<u64>,
    inner: Body,
    /// Made when the first bytes are ready to go (a response whose body has not
    /// started, as an event stream before its first event, holds none), dropped at the
    /// end.
    encoder: Option<Encoder>,
    /// The stream has ended: its last output is in `ready`.
    ended: bool,
    /// The encoder's memory, reserved against its connection's and worker's budgets
    /// until the end.
    reserved: Option<Reserved>,
    /// Frames ready to leave: data, then trailers at the end.
    ready: VecDeque<Frame<Bytes>>,
    /// Input written since the encoder last flushed.
    unflushed: bool,
    /// Input taken from the body beneath and not yet compressed.
    input: Bytes,
}

impl Compressed {
    /// `inner` compressed in `coding`; `length` is its length if known; `reserved` is
    /// its encoder's memory, held until the end.
    pub fn new(
        inner: Body,
        coding: Coding,
        levels: Levels,
        length: Option<u64>,
        reserved: Option<Reserved>,
    ) -> Self {
        Compressed {
            coding,
            levels,
            length,
            inner,
            encoder: None,
            ended: false,
            reserved,
            ready: VecDeque::new(),
            unflushed: false,
            input: Bytes::new(),
        }
    }

    /// The encoder, made now if it was not yet. (zstd could refuse its parameters: it
    /// does not, for these; then the body fails, and the client sees a truncated
    /// message.)
    fn encoder(&mut self) -> io::Result<&mut Encoder> {
        if self.encoder.is_none() {
            self.encoder = Some(Encoder::new(self.coding, self.levels, self.length)?);
        }
        Ok(self.encoder.as_mut().expect("made above"))
    }

    /// Moves the encoder's output, if any, to the frames ready to leave.
    fn take_output(&mut self, at_least: usize) {
        if let Some(e) = self.encoder.as_mut() {
            let out = e.output();
            if !out.is_empty() && out.len() >= at_least {
                let data = std::mem::take(out);
                super::stats::STATS.compressed(self.coding, 0, data.len());
                self.ready.push_back(Frame::data(Bytes::from(data)));
            }
        }
    }

    /// Ends the encoder's stream (an empty body's too: its coding's empty stream); its
    /// last output goes to the ready frames, and its memory is given back.
    fn finish(&mut self) -> io::Result<()> {
        self.encoder()?;
        let last = self.encoder.take().expect("made above").finish()?;
        self.ended = true;
        self.reserved = None;
        super::stats::STATS.compressed(self.coding, 0, last.len());
        if !last.is_empty() {
            self.ready.push_back(Frame::data(Bytes::from(last)));
        }
        Ok(())
    }
}

impl hyper::body::Body for Compressed {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        let mut budget = INPUT_PER_POLL;
        loop {
            if let Some(frame) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(frame)));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            if !this.input.is_empty() {
                if budget == 0 {
                    // This poll has compressed its share: the worker's other tasks run
                    // before the rest (no flush: the body beneath is not waiting).
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                let piece = this.input.split_to(this.input.len().min(budget));
                budget -= piece.len();
                this.encoder()?.write(&piece)?;
                super::stats::STATS.compressed(this.coding, piece.len(), 0);
                this.unflushed = true;
                this.take_output(CHUNK);
                continue;
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => this.input = data,
                    Err(frame) => {
                        // Trailers: the body's end.
                        this.finish()?;
                        if frame.is_trailers() {
                            this.ready.push_back(frame);
                        }
                    }
                },
                Poll::Ready(Some(Err(e))) => {
                    // The body beneath failed: so does this one (the client sees a
                    // truncated message), and nothing more is sent.
                    this.encoder = None;
                    this.reserved = None;
                    this.ended = true;
                    this.ready.clear();
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => this.finish()?,
                Poll::Pending => {
                    // Nothing more for now: what was written leaves, decodable.
                    if this.unflushed {
                        this.encoder()?.flush()?;
                        this.unflushed = false;
                        this.take_output(1);
                    }
                    if this.ready.is_empty() {
                        return Poll::Pending;
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.ready.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use hyper::body::Body as _;
    use std::io::Read;

    fn sample() -> Vec<u8> {
        (0..200_000u32)
            .flat_map(|i| format!("line {i} of the sample, {}\n", i % 97).into_bytes())
            .collect()
    }

    fn decode(coding: Coding, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match coding {
            Coding::Gzip => flate2::read::GzDecoder::new(data)
                .read_to_end(&mut out)
                .unwrap(),
            Coding::Brotli => brotli::Decompressor::new(data, 4096)
                .read_to_end(&mut out)
                .unwrap(),
            Coding::Zstd => zstd::stream::read::Decoder::new(data)
                .unwrap()
                .read_to_end(&mut out)
                .unwrap(),
        };
        out
    }

    fn levels() -> Levels {
        Levels {
            gzip: 1,
            brotli: 4,
            zstd: 3,
        }
    }

    #[test]
    fn every_coding_round_trips_and_shrinks_text() {
        let plain = sample();
        for coding in Coding::ALL {
            let body = Compressed::new(
                Body::bytes(plain.clone()),
                coding,
                levels(),
                Some(plain.len() as u64),
                None,
            );
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let out = rt.block_on(body.collect()).unwrap().to_bytes();
            assert!(
                out.len() * 4 < plain.len(),
                "{coding:?}: {} of {}",
                out.len(),
                plain.len()
            );
            assert_eq!(decode(coding, &out), plain, "{coding:?}");
        }
    }

    /// A stream that yields its pieces one poll apart (Pending between them), as an
    /// upstream sending events does.
    struct Trickle(VecDeque<Bytes>, bool);

    impl hyper::body::Body for Trickle {
        type Data = Bytes;
        type Error = io::Error;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
            self.1 = !self.1;
            if self.1 {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
        }
    }

    #[test]
    fn a_stream_that_pauses_has_what_it_sent_flushed_decodable() {
        for coding in Coding::ALL {
            let events: VecDeque<Bytes> = (0..3)
                .map(|i| Bytes::from(format!("data: event {i}\n\n")))
                .collect();
            let mut body = Compressed::new(
                Body::stream(Trickle(events, false)),
                coding,
                levels(),
                None,
                None,
            );
            let waker = futures_util::task::noop_waker();
            let mut cx = Context::from_waker(&waker);
            let mut sent = Vec::new();
            // Each event is decodable as soon as the stream pauses after it, before the
            // end: the first frames out hold the first event whole.
            let first = loop {
                match Pin::new(&mut body).poll_frame(&mut cx) {
                    Poll::Ready(Some(Ok(f))) => {
                        sent.extend_from_slice(&f.into_data().unwrap());
                        break sent.clone();
                    }
                    Poll::Pending => continue,
                    other => panic!("{coding:?}: {:?}", other.is_ready()),
                }
            };
            // Exactly the first event: had the encoder not flushed when the stream
            // paused, its first output would have come at the end, with every event.
            let partial = partial_decode(coding, &first);
            assert_eq!(
                partial,
                b"data: event 0\n\n",
                "{coding:?}: {:?}",
                String::from_utf8_lossy(&partial)
            );
            loop {
                match Pin::new(&mut body).poll_frame(&mut cx) {
                    Poll::Ready(Some(Ok(f))) => sent.extend_from_slice(&f.into_data().unwrap()),
                    Poll::Ready(None) => break,
                    Poll::Pending => continue,
                    Poll::Ready(Some(Err(e))) => panic!("{e}"),
                }
            }
            assert_eq!(
                decode(coding, &sent),
                b"data: event 0\n\ndata: event 1\n\ndata: event 2\n\n"
            );
        }
    }

    /// What a decoder makes of a stream cut short: everything up to the cut.
    fn partial_decode(coding: Coding, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0u8; 1024];
        let mut reader: Box<dyn Read> = match coding {
            Coding::Gzip => Box::new(flate2::read::GzDecoder::new(data)),
            Coding::Brotli => Box::new(brotli::Decompressor::new(data, 4096)),
            Coding::Zstd => Box::new(zstd::stream::read::Decoder::new(data).unwrap()),
        };
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        out
    }
}
