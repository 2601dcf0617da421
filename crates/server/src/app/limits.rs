//! A server's or route's `rate` asked for a request: the client it counts (the client's
//! address, after a trusted PROXY header, or a header's value), the per-client limits'
//! verdict (`terminus_admission::clients`), and the 429 a refused request gets, with
//! `Retry-After`.

use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::time::Duration;

use hyper::header::{HeaderValue, RETRY_AFTER};
use hyper::{Request, Response};
use terminus_admission::clients::{Client, Clients, Rate, Verdict};
use terminus_config::{RateKey, RateLimit, ServerConfig};
use terminus_http::body::{Body, RequestBody};

/// One `rate` of the configuration, as the limits are asked it.
#[derive(Debug, Clone)]
pub struct RateRule {
    /// Which rate: its clients are counted apart from every other rate's. The same
    /// server, route and setting give the same zone after a reload, so what clients
    /// used is kept; a changed setting starts afresh.
    zone: u64,
    rate: Rate,
    key: RateKey,
}

impl RateRule {
    /// `limit`, written on `server` (on its route for `route`, if given).
    pub fn new(server: &ServerConfig, route: Option<&str>, limit: &RateLimit) -> Self {
        // SipHash with fixed keys: the same zone for the same rule, in this binary.
        let mut h = std::hash::DefaultHasher::new();
        (
            server.names.first(),
            route,
            limit.requests,
            limit.per,
            limit.burst,
        )
            .hash(&mut h);
        match &limit.key {
            RateKey::Client => 0u8.hash(&mut h),
            RateKey::Header(name) => name.as_str().hash(&mut h),
        }
        Self {
            zone: h.finish(),
            rate: Rate::new(limit.requests, limit.per, limit.burst),
            key: limit.key.clone(),
        }
    }

    /// Counts `req` from `peer` against the rule: how long it must wait, when refused.
    pub fn check(
        &self,
        clients: &Clients,
        req: &Request<RequestBody>,
        peer: IpAddr,
    ) -> Option<Duration> {
        let client = match &self.key {
            RateKey::Client => Client::Address(peer),
            RateKey::Header(name) => req
                .headers()
                .get(name)
                .map_or(Client::Address(peer), |value| Client::Key(value.as_bytes())),
        };
        match clients.request(self.zone, client, self.rate) {
            Verdict::Pass => None,
            Verdict::Refuse { retry_after } => Some(retry_after),
        }
    }
}

/// A 429's `Retry-After`: whole seconds, rounded up (a client retrying then passes).
pub fn with_retry_after(mut resp: Response<Body>, wait: Duration) -> Response<Body> {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    resp.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_whole_seconds_rounded_up() {
        let after = |wait| {
            with_retry_after(Response::new(Body::Empty), wait).headers()[RETRY_AFTER]
                .to_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(after(Duration::from_millis(1)), "1");
        assert_eq!(after(Duration::from_millis(1000)), "1");
        assert_eq!(after(Duration::from_millis(1001)), "2");
        assert_eq!(after(Duration::from_secs(59)), "59");
        assert_eq!(after(Duration::ZERO), "1");
    }
}
