//! One request over one HTTP/1.1 connection to an upstream server: the head written, the
//! body streamed after it (by [`pump`], content-length or chunked, trailers kept) while
//! the response head is awaited, the head parsed as strictly as a client's request, and
//! the response body handed on as a stream ([`body`]) that puts the connection back in
//! the pool when both messages ended cleanly.

mod body;
pub(crate) mod head;
mod pump;

pub(crate) use body::Http1Body;

use std::io;
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use hyper::body::SizeHint;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Response, StatusCode};
use terminus_http::h1::{
    parse_response_head, response_framing, Decoder, Framing, PassedFields, ResponseHead, MAX_HEAD,
};
use terminus_http::Upstreamed;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::headers::remove_hop_by_hop;
use crate::metrics::{Failure, Phase};
use crate::pool::{Conn, Pool};
use crate::replay::Replayable;
use crate::spec::Timeouts;
use crate::upstream::InProgress;
use pump::{Pump, PumpError};

/// How a request body goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyFraming {
    None,
    /// `Content-Length: N`: the pump sends exactly N bytes or fails.
    Length(u64),
    Chunked,
}

/// Why an exchange ended without a response to pass on.
#[derive(Debug)]
pub(crate) struct Failed<B> {
    /// Who is at fault: `None` when it was the client (its body failed).
    pub(crate) failure: Option<Failure>,
    pub(crate) detail: String,
    /// The request body, when none of it was taken or all that was is held
    /// ([`crate::replay`]): the request may be sent again.
    pub(crate) body: Option<B>,
    /// A reused connection that turned out closed: the server had closed it while idle,
    /// which is no fault of the server's.
    pub(crate) stale: Option<Stale>,
}

/// How a reused connection was found closed, which says whether the server can have
/// seen the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stale {
    /// Writing the request head failed: the connection was gone before the server could
    /// read a byte of it.
    Unsent,
    /// It ended before any byte of a response. Almost always the request crossed the
    /// server's keep-alive close, but a server that read it and then failed looks the
    /// same: only a request that is safe to repeat goes again (RFC 9110 section 9.2.2).
    Unanswered,
}

/// What one exchange needs besides the connection and the body.
pub(crate) struct Exchange<'a> {
    pub(crate) head: &'a [u8],
    pub(crate) method: &'a Method,
    pub(crate) framing: BodyFraming,
    pub(crate) timeouts: Timeouts,
    pub(crate) keepalive: crate::spec::Keepalive,
    pub(crate) pool: &'a Rc<Pool>,
    pub(crate) pool_key: crate::pool::Key,
    pub(crate) started: Instant,
    /// The protocol the client asked to switch to (`Upgrade`), passed on: a 101 then
    /// hands the connection over instead of being refused.
    pub(crate) upgrade: Option<&'a HeaderValue>,
    /// The client's head came as bytes (HTTP/1.1): the response's goes back the same way
    /// ([`PassedFields`]), not as a map.
    pub(crate) pass_head: bool,
}

impl Exchange<'_> {
    /// Sends the request on `stream` and reads the response head.
    pub(crate) async fn run<B>(
        self,
        conn: Conn,
        reused: bool,
        body: Replayable<B>,
        progress: InProgress,
    ) -> Result<Response<terminus_http::Body>, Failed<Replayable<B>>>
    where
        B: hyper::body::Body<Data = Bytes, Error = io::Error> + 'static,
    {
        let keeper = body.keeper();
        let metrics = progress.server().metrics.clone();
        let Conn {
            mut read,
            mut write,
            mut buf,
        } = conn;
        let fail = |failure, detail: String, body| Failed {
            failure: Some(failure),
            detail,
            body,
            stale: None,
        };
        // Flushed: over TLS a write may leave the record in rustls's buffer.
        let send_head = async {
            write.write_all(self.head).await?;
            write.flush().await
        };
        if let Err(e) = tokio::time::timeout(self.timeouts.idle, send_head)
            .await
            .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into()))
        {
            return Err(Failed {
                stale: reused.then_some(Stale::Unsent),
                ..fail(
                    Failure::Io,
                    format!("writing the request head: {e}"),
                    Some(body),
                )
            });
        }
        let sent_at = Instant::now();
        let mut body = Some(body);
        let mut pump = match self.framing {
            BodyFraming::None => Pump::Done(write),
            BodyFraming::Length(n) => Pump::start(
                write,
                body.take().expect("body"),
                Some(n),
                self.timeouts.idle,
                metrics.clone(),
            ),
            BodyFraming::Chunked => Pump::start(
                write,
                body.take().expect("body"),
                None,
                self.timeouts.idle,
                metrics.clone(),
            ),
        };

        // The head, with the body going out meanwhile; the response_header timeout runs
        // from the end of the request (the body may take long to upload).
        let mut deadline = pump
            .is_done()
            .then(|| Instant::now() + self.timeouts.response_header);
        // Any byte of a response, an interim one (100, 103) included: the server saw the
        // request.
        let mut answered = false;
        let resp = loop {
            match parse_response_head(&mut buf) {
                Ok(Some(resp))
                    if resp.status.is_informational()
                        && resp.status != StatusCode::SWITCHING_PROTOCOLS =>
                {
                    // 100 Continue (the proxy answered the client's itself) and 103:
                    // interim, not passed on.
                    continue;
                }
                Ok(Some(resp)) => break resp,
                Ok(None) if buf.len() > MAX_HEAD => {
                    return Err(fail(
                        Failure::BadResponse,
                        format!("response head over {MAX_HEAD} bytes"),
                        body,
                    ))
                }
                Ok(None) => {}
                Err(e) => {
                    return Err(fail(
                        Failure::BadResponse,
                        format!("malformed response head: {}", e.0),
                        body,
                    ))
                }
            }
            let header_due = deadline;
            let wait = async move {
                match header_due {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            // A connection that ends before any response byte: the request again, if
            // its body can be (the pump that was sending it dropped first).
            let unanswered =
                |failure, detail, body: Option<Replayable<B>>, pump, answered: bool| {
                    drop::<Pump>(pump);
                    let body = body.or_else(|| (!answered).then(|| keeper.rewind()).flatten());
                    let stale = reused && !answered && body.is_some();
                    Err(Failed {
                        stale: stale.then_some(Stale::Unanswered),
                        ..fail(failure, detail, body)
                    })
                };
            tokio::select! {
                biased;
                n = read_some(&mut read, &mut buf) => match n {
                    Ok(0) => {
                        let detail = "closed the connection before a response".into();
                        return unanswered(Failure::Closed, detail, body, pump, answered);
                    }
                    Ok(_) => answered = true,
                    Err(e) => {
                        let detail = format!("reading the response: {e}");
                        return unanswered(Failure::Io, detail, body, pump, answered);
                    }
                },
                done = pump.wait(), if !pump.is_done() => match done {
                    Ok(()) => deadline = Some(Instant::now() + self.timeouts.response_header),
                    Err(PumpError::Client(e)) => {
                        return Err(Failed {
                            failure: None,
                            detail: format!("the client's request body failed: {e}"),
                            body: None,
                            stale: None,
                        });
                    }
                    // The server may have answered early and stopped reading (a 413,
                    // say): its response is still worth reading.
                    Err(PumpError::Upstream(e)) => {
                        tracing::debug!("request body not sent whole: {e}");
                        deadline = Some(Instant::now() + self.timeouts.response_header);
                    }
                },
                () = wait => {
                    return Err(fail(
                        Failure::ResponseTimeout,
                        format!("no response head within {:?}", self.timeouts.response_header),
                        body,
                    ));
                }
            }
        };
        let header_time = sent_at.elapsed();
        metrics.latency(Phase::ResponseHeader, header_time);
        keeper.release();

        let ResponseHead {
            status,
            version,
            mut fields,
        } = resp;
        if status == StatusCode::SWITCHING_PROTOCOLS {
            let Some(asked) = self.upgrade else {
                return Err(fail(
                    Failure::BadResponse,
                    "101 Switching Protocols to a request that asked for no upgrade".into(),
                    body,
                ));
            };
            let Pump::Done(write) = pump else {
                let detail = "101 before the request was sent whole".into();
                return Err(fail(Failure::BadResponse, detail, body));
            };
            metrics.response(101);
            progress.upstream.succeeded(progress.server);
            // The server may switch only to a protocol the request passed on (the
            // allowed ones): anything else would be a channel no route chose.
            let offered: Vec<&str> = terminus_http::h1::tokens(&fields, header::UPGRADE).collect();
            let passed = asked.to_str().unwrap_or("");
            let to = match offered.as_slice() {
                [] if !passed.contains(',') => asked.clone(),
                [one]
                    if passed
                        .split(',')
                        .any(|t| t.trim().eq_ignore_ascii_case(one)) =>
                {
                    HeaderValue::from_str(one).unwrap_or_else(|_| asked.clone())
                }
                _ => {
                    let detail =
                        format!("101 to {offered:?}, which the request did not pass on ({passed})");
                    return Err(fail(Failure::BadResponse, detail, body));
                }
            };
            // The switch is this hop's: Connection and Upgrade are said again for it.
            remove_hop_by_hop(&mut fields);
            let mut resp = Response::new(terminus_http::Body::Empty);
            *resp.status_mut() = status;
            *resp.version_mut() = version;
            let Some(map) = map_of(&fields) else {
                return Err(fail(Failure::BadResponse, BAD_FIELD.into(), body));
            };
            *resp.headers_mut() = map;
            let headers = resp.headers_mut();
            headers.insert(header::UPGRADE, to);
            headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            let server = progress.server().spec.address;
            resp.extensions_mut().insert(Upstreamed {
                server,
                status: 101,
                header_time,
            });
            resp.extensions_mut().insert(crate::tunnel::upgrade(
                Conn { read, write, buf },
                self.timeouts.idle,
            ));
            return Ok(resp);
        }
        let framing = match response_framing(self.method, status, &fields, version) {
            Ok(f) => f,
            Err(e) => {
                return Err(fail(
                    Failure::BadResponse,
                    format!("response framing: {}", e.0),
                    body,
                ))
            }
        };
        let keep_alive = terminus_http::h1::keeps_alive(version, &fields)
            && framing != Framing::Close
            && self.keepalive.idle > 0;
        metrics.response(status.as_u16());
        remove_hop_by_hop(&mut fields);
        let hint = match framing {
            Framing::None => SizeHint::with_exact(0),
            Framing::Length(n) => SizeHint::with_exact(n),
            Framing::Chunked | Framing::Close => {
                fields.remove(&header::CONTENT_LENGTH);
                SizeHint::new()
            }
        };
        let map = match self.pass_head {
            true => None,
            false => match map_of(&fields) {
                Some(map) => Some(map),
                None => return Err(fail(Failure::BadResponse, BAD_FIELD.into(), body)),
            },
        };
        let server = progress.server().spec.address;
        let body = terminus_http::Body::stream(Http1Body::reading(body::Reading {
            read,
            buf,
            decoder: Decoder::new(framing),
            pump,
            keep_alive,
            hint,
            stall: crate::stall::Stall::new(self.timeouts.idle),
            pool: self.pool.clone(),
            pool_key: self.pool_key,
            keepalive: self.keepalive,
            progress,
            started: self.started,
        }));
        let mut resp = Response::new(body);
        *resp.status_mut() = status;
        *resp.version_mut() = version;
        resp.extensions_mut().insert(Upstreamed {
            server,
            status: status.as_u16(),
            header_time,
        });
        match map {
            Some(map) => *resp.headers_mut() = map,
            None => {
                resp.extensions_mut().insert(PassedFields(fields));
            }
        }
        Ok(resp)
    }
}

/// A response's fields as a map, for a client or a rule that needs one; `None` for a
/// field a map cannot hold (httparse's grammar rules that out).
fn map_of(fields: &terminus_http::h1::RawHead) -> Option<hyper::HeaderMap> {
    fields.to_header_map()
}

const BAD_FIELD: &str = "a response field no map can hold";

/// Reads what the socket has into the end of `buf`.
async fn read_some(read: &mut crate::connect::ReadHalf, buf: &mut Vec<u8>) -> io::Result<usize> {
    // Grown only when little room is left: a head that came in two segments reads its
    // rest into the room the first read left, not into a reallocated buffer.
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(4 * 1024);
    }
    read.read_buf(buf).await
}
