//! WebSockets from HTTP/2 clients (RFC 8441) to HTTP/1.1 upstreams. An h2 client opens a
//! WebSocket with an extended CONNECT (`:protocol = websocket`, once the server has sent
//! `SETTINGS_ENABLE_CONNECT_PROTOCOL`), and its stream then carries the WebSocket's
//! frames. The upstream expects RFC 6455's opening handshake instead, so the request
//! goes to it as `GET` with `Upgrade: websocket` and a `Sec-WebSocket-Key` made here (an
//! h2 client sends none); the upstream's 101 is checked against that key and answered to
//! the client as 200, after which the stream and the upstream connection are one tunnel
//! ([`crate::tunnel`]), as for an HTTP/1.1 client's upgrade. HAProxy and Envoy translate
//! the same way.

use aws_lc_rs::digest;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Method, Response, StatusCode};

use terminus_http::Body;

/// RFC 6455 §1.3: the accept value is SHA-1 of the key and this.
const ACCEPT_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

const SEC_WEBSOCKET_KEY: HeaderName = HeaderName::from_static("sec-websocket-key");
const SEC_WEBSOCKET_ACCEPT: HeaderName = HeaderName::from_static("sec-websocket-accept");

/// What a CONNECT request asks of the proxy.
pub(crate) enum Connect {
    /// Not a CONNECT.
    No,
    /// An extended CONNECT for a WebSocket.
    WebSocket,
    /// A CONNECT for anything else (a plain one asks for a TCP tunnel to an authority:
    /// terminus is no forward proxy), answered with this status.
    Refused(StatusCode),
}

/// What `parts` asks for, when it is a CONNECT.
pub(crate) fn connect_kind(parts: &hyper::http::request::Parts) -> Connect {
    if parts.method != Method::CONNECT {
        return Connect::No;
    }
    match parts.extensions.get::<hyper::ext::Protocol>() {
        Some(p) if p.as_str().eq_ignore_ascii_case("websocket") => Connect::WebSocket,
        Some(_) => Connect::Refused(StatusCode::NOT_IMPLEMENTED),
        None => Connect::Refused(StatusCode::METHOD_NOT_ALLOWED),
    }
}

/// The opening handshake sent upstream for one h2 client's WebSocket.
pub(crate) struct Opening {
    key: HeaderValue,
}

impl Opening {
    /// Makes the extended CONNECT in `parts` the HTTP/1.1 request an RFC 6455 server
    /// expects (the `Upgrade` and `Connection` fields are the upgrade path's to add).
    pub(crate) fn rewrite(parts: &mut hyper::http::request::Parts) -> Self {
        let mut nonce = [0u8; 16];
        aws_lc_rs::rand::fill(&mut nonce).expect("the system's random source works");
        let key = HeaderValue::from_str(&STANDARD.encode(nonce)).expect("base64 is a valid field");
        parts.method = Method::GET;
        parts.version = hyper::Version::HTTP_11;
        parts.extensions.remove::<hyper::ext::Protocol>();
        parts.headers.insert(SEC_WEBSOCKET_KEY, key.clone());
        Opening { key }
    }

    /// The upstream's answer as the h2 client takes it: a 101 that accepted our key
    /// becomes 200 (RFC 8441 §5), a refusal (3xx to 5xx) goes as it is. Else why the
    /// server is not opening a WebSocket for us: a 101 whose `Sec-WebSocket-Accept` is
    /// not the one our key calls for, or a 2xx, which the client would take for an open
    /// WebSocket with nothing behind it.
    pub(crate) fn answer(&self, mut resp: Response<Body>) -> Result<Response<Body>, &'static str> {
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            return match resp.status().is_success() {
                true => Err("a 2xx to a WebSocket opening handshake, not 101"),
                false => Ok(resp),
            };
        }
        let expected = accept_for(self.key.as_bytes());
        match resp.headers_mut().remove(SEC_WEBSOCKET_ACCEPT) {
            Some(accept) if accept.as_bytes() == expected.as_bytes() => {}
            _ => return Err("a 101 whose Sec-WebSocket-Accept does not answer our key"),
        }
        *resp.status_mut() = StatusCode::OK;
        let headers = resp.headers_mut();
        headers.remove(header::UPGRADE);
        headers.remove(header::CONNECTION);
        Ok(resp)
    }
}

/// RFC 6455 §4.2.2: the `Sec-WebSocket-Accept` that answers `key`.
fn accept_for(key: &[u8]) -> String {
    let mut ctx = digest::Context::new(&digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(key);
    ctx.update(ACCEPT_GUID);
    STANDARD.encode(ctx.finish().as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accept_value_is_rfc_6455s() {
        // RFC 6455 §1.3's example.
        assert_eq!(
            accept_for(b"dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn only_a_101_with_our_keys_accept_opens_the_websocket() {
        let (mut parts, ()) = hyper::Request::new(()).into_parts();
        parts.method = Method::CONNECT;
        let opening = Opening::rewrite(&mut parts);
        assert_eq!(parts.method, Method::GET);
        let key = parts.headers[SEC_WEBSOCKET_KEY].as_bytes().to_vec();
        assert_eq!(STANDARD.decode(&key).unwrap().len(), 16);
        let switched = |accept: &str| {
            Response::builder()
                .status(101)
                .header(SEC_WEBSOCKET_ACCEPT, accept)
                .header(header::UPGRADE, "websocket")
                .body(Body::Empty)
                .unwrap()
        };
        let good = opening.answer(switched(&accept_for(&key))).unwrap();
        assert_eq!(good.status(), StatusCode::OK);
        assert!(good.headers().get(header::UPGRADE).is_none());
        let other = accept_for(b"dGhlIHNhbXBsZSBub25jZQ==");
        assert!(opening.answer(switched(&other)).is_err());
        let status = |code| Response::builder().status(code).body(Body::Empty).unwrap();
        assert!(opening.answer(status(200)).is_err(), "a 200 opens nothing");
        assert_eq!(opening.answer(status(403)).unwrap().status(), 403);
    }
}
