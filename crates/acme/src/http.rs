//! The HTTP client that reaches the CA: instant-acme's requests over hyper and rustls
//! (the system's roots, or a private CA's root), with the CA's word on when to come back
//! kept. instant-acme reads a `Retry-After` only while it polls an order; a 429 (rate
//! limited) or a 503 carries one too (RFC 8555 section 6.6), and this client keeps the
//! latest so that the next attempt waits at least that long. It also fetches the
//! directory on its own, for `terminus check`.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use instant_acme::{BodyWrapper, BytesResponse, HttpClient};

use crate::schedule::LONGEST_RETRY;
use crate::settings::AcmeSettings;

/// Why the CA cannot be reached, or what it answered is not what an ACME client needs.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// The private CA's root (`[acme] ca`) cannot be read.
    #[error("{}: {source}", path.display())]
    ReadRoot {
        /// The file.
        path: PathBuf,
        /// What reading it (or its PEM) said.
        #[source]
        source: std::io::Error,
    },
    /// The private CA's root file holds no certificate.
    #[error("{}: no certificate in it", path.display())]
    NoRoot {
        /// The file.
        path: PathBuf,
    },
    /// rustls will not take the private CA's root.
    #[error("{}: {source}", path.display())]
    BadRoot {
        /// The file.
        path: PathBuf,
        /// What rustls said.
        #[source]
        source: rustls::Error,
    },
    /// The system's roots cannot be used.
    #[error("the system's roots: {0}")]
    SystemRoots(#[source] rustls::Error),
    /// The runtime `terminus check` asks the CA on could not be made.
    #[error(transparent)]
    Runtime(std::io::Error),
    /// The request for the directory could not be made (its URL).
    #[error("{url}: {source}")]
    Request {
        /// The directory's URL.
        url: String,
        /// What the request builder said.
        #[source]
        source: http::Error,
    },
    /// The directory's server does not answer (connection, TLS, HTTP).
    #[error("{url}: {}", chain(source))]
    Unanswered {
        /// The directory's URL.
        url: String,
        /// What the client said, with what failed underneath.
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    /// No answer in time.
    #[error("{url}: no answer in 10 s")]
    Timeout {
        /// The directory's URL.
        url: String,
    },
    /// The answer's body could not be read.
    #[error("{url}: {source}")]
    Body {
        /// The directory's URL.
        url: String,
        /// What reading it said.
        #[source]
        source: hyper::Error,
    },
    /// The answer is not a 200.
    #[error("{url} answered {status}")]
    Status {
        /// The directory's URL.
        url: String,
        /// Its status.
        status: StatusCode,
    },
    /// The answer is not JSON.
    #[error("{url} is not an ACME directory: {source}")]
    NotJson {
        /// The directory's URL.
        url: String,
        /// What the JSON parser said.
        #[source]
        source: serde_json::Error,
    },
    /// The directory lacks a resource every ACME directory has.
    #[error("{url} is not an ACME directory: it has no {needed}")]
    NotDirectory {
        /// The directory's URL.
        url: String,
        /// The resource it lacks.
        needed: &'static str,
    },
    /// The profile asked for is not offered.
    #[error("[acme] profile = {profile:?}, but {url} offers {}", if offered.is_empty() { "no profiles".to_owned() } else { offered.join(", ") })]
    Profile {
        /// The profile configured.
        profile: String,
        /// The directory's URL.
        url: String,
        /// The profiles it offers.
        offered: Vec<String>,
    },
    /// The CA requires an account binding that is not configured.
    #[error("{url} requires external account binding: set [acme] eab = {{ kid = \"...\", hmac_key_file = \"...\" }} from the CA's account page")]
    EabRequired {
        /// The directory's URL.
        url: String,
    },
}

/// How long one request to the CA may take: a CA that stops answering must not hold an
/// order (and, in a fleet, its lock) for longer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The CA's client; clones share what the CA asked.
#[derive(Clone)]
pub(crate) struct CaClient {
    https: Client<HttpsConnector<HttpConnector>, BodyWrapper<Bytes>>,
    /// No request before this, as the CA last said, and the status it said it with.
    not_before: Arc<Mutex<Option<(SystemTime, StatusCode)>>>,
}

impl CaClient {
    /// A client trusting `ca`'s first certificate, or the system's roots.
    pub(crate) fn new(ca: Option<&Path>) -> Result<Self, CaError> {
        let builder = hyper_rustls::HttpsConnectorBuilder::new();
        let builder = match ca {
            Some(path) => {
                let unread = |source| CaError::ReadRoot {
                    path: path.to_owned(),
                    source,
                };
                let pem = std::fs::read(path).map_err(unread)?;
                let root = rustls_pemfile::certs(&mut &pem[..])
                    .next()
                    .transpose()
                    .map_err(unread)?
                    .ok_or_else(|| CaError::NoRoot {
                        path: path.to_owned(),
                    })?;
                let mut roots = rustls::RootCertStore::empty();
                roots.add(root).map_err(|source| CaError::BadRoot {
                    path: path.to_owned(),
                    source,
                })?;
                builder.with_tls_config(
                    rustls::ClientConfig::builder()
                        .with_root_certificates(roots)
                        .with_no_client_auth(),
                )
            }
            None => builder
                .try_with_platform_verifier()
                .map_err(CaError::SystemRoots)?,
        };
        let connector = builder.https_only().enable_http1().enable_http2().build();
        Ok(Self {
            https: Client::builder(TokioExecutor::new()).build(connector),
            not_before: Arc::default(),
        })
    }

    /// How long the CA last asked to be left alone, from now, and the status it
    /// answered with; `None` if it did not, or that time is past.
    pub(crate) fn asked_to_wait(&self) -> Option<(Duration, StatusCode)> {
        let (at, status) = (*self.not_before.lock().unwrap_or_else(|p| p.into_inner()))?;
        at.duration_since(SystemTime::now())
            .ok()
            .filter(|d| !d.is_zero())
            .map(|d| (d, status))
    }

    /// The directory at `url`, parsed: what `terminus check` reports.
    pub(crate) async fn directory(&self, url: &str) -> Result<serde_json::Value, CaError> {
        let url = || url.to_owned();
        let request = Request::get(url())
            .header(http::header::USER_AGENT, "terminus (ACME check)")
            .body(BodyWrapper::default())
            .map_err(|source| CaError::Request { url: url(), source })?;
        let response = self
            .https
            .request(request)
            .await
            .map_err(|source| CaError::Unanswered { url: url(), source })?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|source| CaError::Body { url: url(), source })?
            .to_bytes();
        if status != StatusCode::OK {
            return Err(CaError::Status { url: url(), status });
        }
        serde_json::from_slice(&body).map_err(|source| CaError::NotJson { url: url(), source })
    }
}

/// An error with its sources, for a message that says what failed underneath.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

impl HttpClient for CaClient {
    fn request(
        &self,
        req: Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>> {
        let sent = tokio::time::timeout(REQUEST_TIMEOUT, self.https.request(req));
        let not_before = self.not_before.clone();
        Box::pin(async move {
            let response = sent
                .await
                .map_err(|_| instant_acme::Error::Str("the CA did not answer in 30 s"))?
                .map_err(|e| instant_acme::Error::Other(Box::new(e)))?;
            let status = response.status();
            if matches!(
                status,
                StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
            ) {
                if let Some(at) = response
                    .headers()
                    .get(RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| retry_after(v, SystemTime::now()))
                {
                    let mut held = not_before.lock().unwrap_or_else(|p| p.into_inner());
                    if held.map_or(true, |(t, _)| at > t) {
                        *held = Some((at, status));
                    }
                }
            }
            Ok(BytesResponse::from(response))
        })
    }
}

/// When a `Retry-After` value (delay-seconds or an HTTP-date, RFC 9110 section 10.2.3)
/// received at `now` says to come back, at most [`LONGEST_RETRY`] away.
pub(crate) fn retry_after(value: &str, now: SystemTime) -> Option<SystemTime> {
    let value = value.trim();
    let at = match value.parse::<u64>() {
        Ok(secs) => now.checked_add(Duration::from_secs(secs.min(LONGEST_RETRY.as_secs())))?,
        Err(_) => httpdate::parse_http_date(value).ok()?,
    };
    Some(at.min(now + LONGEST_RETRY))
}

/// `terminus check`'s look at the issuer: the directory answers, is an ACME directory,
/// offers the profile asked for, and does not ask for an account binding that is not
/// configured. Returns what it found.
pub fn check_issuer(settings: &AcmeSettings) -> Result<String, IssuerProblem> {
    let client = CaClient::new(settings.ca.as_deref()).map_err(IssuerProblem::Wrong)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| IssuerProblem::Wrong(CaError::Runtime(e)))?;
    let url = &settings.directory;
    let directory = runtime
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(10), client.directory(url))
                .await
                .map_err(|_| CaError::Timeout { url: url.clone() })?
        })
        .map_err(IssuerProblem::Unreachable)?;
    for needed in ["newNonce", "newAccount", "newOrder"] {
        if !directory.get(needed).is_some_and(|v| v.is_string()) {
            return Err(IssuerProblem::Wrong(CaError::NotDirectory {
                url: url.clone(),
                needed,
            }));
        }
    }
    let meta = directory.get("meta");
    if let Some(profile) = &settings.profile {
        let offered = meta
            .and_then(|m| m.get("profiles"))
            .and_then(|p| p.as_object());
        if !offered.is_some_and(|p| p.contains_key(profile)) {
            return Err(IssuerProblem::Wrong(CaError::Profile {
                profile: profile.clone(),
                url: url.clone(),
                offered: offered
                    .map(|p| p.keys().cloned().collect())
                    .unwrap_or_default(),
            }));
        }
    }
    let eab_required = meta
        .and_then(|m| m.get("externalAccountRequired"))
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    if eab_required && settings.eab.is_none() {
        return Err(IssuerProblem::Wrong(CaError::EabRequired {
            url: url.clone(),
        }));
    }
    Ok(format!(
        "{url} answers as an ACME directory{}",
        if directory.get("renewalInfo").is_some() {
            " with renewal information (ARI)"
        } else {
            " (no ARI: renewal at 2/3 of the lifetime)"
        }
    ))
}

/// What `terminus check` found wrong with an issuer.
#[derive(Debug)]
pub enum IssuerProblem {
    /// It does not answer now: the server would start and keep trying (a warning).
    Unreachable(CaError),
    /// It cannot work as configured.
    Wrong(CaError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_read_as_seconds_or_as_an_http_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert_eq!(
            retry_after(" 120 ", now),
            Some(now + Duration::from_secs(120))
        );
        let date = httpdate::fmt_http_date(now + Duration::from_secs(3600));
        assert_eq!(
            retry_after(&date, now),
            Some(now + Duration::from_secs(3600))
        );
        assert_eq!(retry_after("soon", now), None);
        let day = now + Duration::from_secs(86_400);
        assert_eq!(retry_after(&u64::MAX.to_string(), now), Some(day));
        assert_eq!(retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now), Some(day));
        assert_eq!(retry_after("-5", now), None);
    }
}
