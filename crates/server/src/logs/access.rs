//! The access log's lines: what is recorded of a request (or of a TCP stream), and how
//! each format writes it. `text` is nginx-like (client, time, request line, status, bytes),
//! with key=value fields after it; `json` is one object a line, named as log shippers' HTTP schemas name
//! them (Vector's and Caddy's `client`, `method`, `path`, `status`, `bytes`,
//! `duration`), every field present (`null` where it does not apply) so that a parser
//! needs no schema per line.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use hyper::Version;
use serde::Serialize;
use terminus_config::LogFormat;
use terminus_http::Upstreamed;

use super::writer::Writer;

/// When answering a request began, kept in its response's extensions for the access
/// log's `duration` (nginx's `$request_time` starts at the head's first byte; this, once
/// the head is read: a slow client's upload of its head is not the server's time).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Started(pub std::time::Instant);

/// A request and its answer, as the access log records them when the answer's head is
/// sent.
#[derive(Debug)]
pub(crate) struct RequestLine<'a> {
    pub client: SocketAddr,
    pub method: &'a str,
    pub path: &'a str,
    pub version: Version,
    pub status: u16,
    /// The body's length as sent (its `Content-Length`); unknown for a body streamed
    /// without one.
    pub bytes: Option<u64>,
    /// From the request's head read to its answer's head made.
    pub duration: Option<Duration>,
    /// `false`: the plain-HTTP listener's redirect.
    pub tls: Option<Tls<'a>>,
    pub upstream: Option<&'a Upstreamed>,
}

/// What a TLS connection's requests share.
#[derive(Debug)]
pub(crate) struct Tls<'a> {
    pub sni: Option<&'a str>,
    pub version: &'static str,
    pub tenant: &'a str,
    /// nginx's `$ssl_client_verify` and `$ssl_client_s_dn`, where the server asks for
    /// client certificates.
    pub client_verify: Option<(&'static str, Option<&'a str>)>,
    /// The handshake's whole time and its crypto requests' queue wait (Tengine's
    /// `$ssl_handshake_time`).
    pub handshake: Duration,
    pub crypto_wait: Duration,
}

/// A TCP stream (`[[stream]]`), at its end.
#[derive(Debug)]
pub(crate) struct StreamLine<'a> {
    pub client: SocketAddr,
    /// "terminate" or "passthrough".
    pub mode: &'static str,
    pub sni: Option<&'a str>,
    pub upstream: SocketAddr,
    /// To the client, and from it.
    pub sent: u64,
    pub received: u64,
    pub duration: Duration,
    /// How it ended: `None`, closed by either side; else the error that broke it off.
    pub error: Option<String>,
}

/// The access log: where lines go and how they are written.
#[derive(Debug, Clone)]
pub struct AccessLog {
    writer: Writer,
    format: LogFormat,
}

impl AccessLog {
    pub(crate) fn new(writer: Writer, format: LogFormat) -> Self {
        AccessLog { writer, format }
    }

    pub(crate) fn request(&self, line: &RequestLine<'_>) {
        self.writer
            .send(render_request(line, self.format, SystemTime::now()));
    }

    pub(crate) fn stream(&self, line: &StreamLine<'_>) {
        self.writer
            .send(render_stream(line, self.format, SystemTime::now()));
    }

    /// A signature this keyless signer answered: the signer's audit line.
    pub(crate) fn signature(&self, record: &terminus_keyless::signer::AuditRecord) {
        self.writer
            .send(render_signature(record, self.format, SystemTime::now()));
    }
}

/// The audit line of a signature: who asked (address, certificate subject), with which
/// key, for which handshake (SNI, client, as the terminator said), and how it went.
/// Never the digest or the signature.
fn render_signature(
    r: &terminus_keyless::signer::AuditRecord,
    format: LogFormat,
    now: SystemTime,
) -> Vec<u8> {
    let op = r.op.map_or("-", |o| o.name());
    let outcome = r.error.map_or("signed", |e| e.name());
    let key = r.key.map(|k| format!("{k:?}"));
    let client = r.client_ip.map(|ip| ip.to_string());
    match format {
        LogFormat::Text => format!(
            "{} [{}] \"SIGN {op}\" {outcome} \"{}\" key={} sni=\"{}\" tls_client={} time={:.6}\n",
            r.peer,
            Timestamp(now),
            Escaped(&r.terminator),
            key.as_deref().unwrap_or("-"),
            Escaped(r.server_name.as_deref().unwrap_or("-")),
            client.as_deref().unwrap_or("-"),
            r.took.as_secs_f64(),
        )
        .into_bytes(),
        LogFormat::Json => json_line(&JsonSignature {
            time: Timestamp(now).rfc3339(),
            client: r.peer.ip().to_string(),
            client_port: r.peer.port(),
            method: "SIGN",
            op,
            outcome,
            terminator: &r.terminator,
            key: key.as_deref(),
            sni: r.server_name.as_deref(),
            tls_client: client.as_deref(),
            duration: r.took.as_secs_f64(),
        }),
    }
}

#[derive(Serialize)]
struct JsonSignature<'a> {
    time: String,
    client: String,
    client_port: u16,
    method: &'static str,
    op: &'static str,
    outcome: &'static str,
    terminator: &'a str,
    key: Option<&'a str>,
    sni: Option<&'a str>,
    tls_client: Option<&'a str>,
    duration: f64,
}

fn render_request(l: &RequestLine<'_>, format: LogFormat, now: SystemTime) -> Vec<u8> {
    match format {
        LogFormat::Text => {
            let mut s = String::with_capacity(256);
            let _ = write!(
                s,
                "{} [{}] \"{} {} {:?}\" {} ",
                l.client,
                Timestamp(now),
                Escaped(l.method),
                Escaped(l.path),
                l.version,
                l.status
            );
            match l.bytes {
                Some(b) => {
                    let _ = write!(s, "{b}");
                }
                None => s.push('-'),
            }
            match &l.tls {
                None => s.push_str(" \"-\" plain"),
                Some(tls) => {
                    let _ = write!(s, " \"{}\"", Escaped(tls.sni.unwrap_or("-")));
                    text_upstream(&mut s, l.upstream);
                    if let Some((verify, subject)) = tls.client_verify {
                        let _ = write!(
                            s,
                            " client_verify={verify} client_subject=\"{}\"",
                            Escaped(subject.unwrap_or("-"))
                        );
                    }
                    let _ = write!(
                        s,
                        " tls={} tenant={} handshake_time={:.4} crypto_wait={:.4}",
                        tls.version,
                        tls.tenant,
                        tls.handshake.as_secs_f64(),
                        tls.crypto_wait.as_secs_f64()
                    );
                }
            }
            if let Some(d) = l.duration {
                let _ = write!(s, " duration={:.4}", d.as_secs_f64());
            }
            s.push('\n');
            s.into_bytes()
        }
        LogFormat::Json => {
            let tls = l.tls.as_ref();
            json_line(&JsonRequest {
                time: Timestamp(now).rfc3339(),
                client: l.client.ip().to_string(),
                client_port: l.client.port(),
                method: l.method,
                path: l.path,
                protocol: protocol(l.version),
                scheme: if tls.is_some() { "https" } else { "http" },
                status: l.status,
                bytes: l.bytes,
                duration: l.duration.map(|d| d.as_secs_f64()),
                sni: tls.and_then(|t| t.sni),
                tls_version: tls.map(|t| t.version),
                tenant: tls.map(|t| t.tenant),
                upstream: l.upstream.map(|u| u.server.to_string()),
                upstream_status: l.upstream.map(|u| u.status),
                upstream_time: l.upstream.map(|u| u.header_time.as_secs_f64()),
                client_verify: tls.and_then(|t| t.client_verify).map(|(v, _)| v),
                client_subject: tls.and_then(|t| t.client_verify).and_then(|(_, s)| s),
                handshake_time: tls.map(|t| t.handshake.as_secs_f64()),
                crypto_wait: tls.map(|t| t.crypto_wait.as_secs_f64()),
            })
        }
    }
}

fn text_upstream(s: &mut String, upstream: Option<&Upstreamed>) {
    // nginx's $upstream_addr, $upstream_status and $upstream_header_time.
    if let Some(u) = upstream {
        let _ = write!(
            s,
            " upstream={} upstream_status={} upstream_time={:.3}",
            u.server,
            u.status,
            u.header_time.as_secs_f64()
        );
    }
}

fn render_stream(l: &StreamLine<'_>, format: LogFormat, now: SystemTime) -> Vec<u8> {
    match format {
        LogFormat::Text => {
            let end = l
                .error
                .as_ref()
                .map_or_else(|| "closed".to_owned(), |e| format!("\"{}\"", Escaped(e)));
            format!(
                "{} [{}] \"STREAM {}\" {} {} \"{}\" upstream={} time={:.3} end={end}\n",
                l.client,
                Timestamp(now),
                l.mode,
                l.sent,
                l.received,
                Escaped(l.sni.unwrap_or("-")),
                l.upstream,
                l.duration.as_secs_f64(),
            )
            .into_bytes()
        }
        LogFormat::Json => json_line(&JsonStream {
            time: Timestamp(now).rfc3339(),
            client: l.client.ip().to_string(),
            client_port: l.client.port(),
            method: "STREAM",
            mode: l.mode,
            bytes: l.sent,
            bytes_received: l.received,
            duration: l.duration.as_secs_f64(),
            sni: l.sni,
            upstream: l.upstream.to_string(),
            error: l.error.as_deref(),
        }),
    }
}

/// The JSON access log's request line. Field order is the issue's: what a person
/// reading raw lines looks for first comes first.
#[derive(Serialize)]
struct JsonRequest<'a> {
    time: String,
    client: String,
    client_port: u16,
    method: &'a str,
    path: &'a str,
    protocol: &'static str,
    scheme: &'static str,
    status: u16,
    bytes: Option<u64>,
    /// Seconds, as Caddy's and Envoy's JSON logs give them.
    duration: Option<f64>,
    sni: Option<&'a str>,
    tls_version: Option<&'static str>,
    tenant: Option<&'a str>,
    upstream: Option<String>,
    upstream_status: Option<u16>,
    upstream_time: Option<f64>,
    client_verify: Option<&'static str>,
    client_subject: Option<&'a str>,
    handshake_time: Option<f64>,
    crypto_wait: Option<f64>,
}

#[derive(Serialize)]
struct JsonStream<'a> {
    time: String,
    client: String,
    client_port: u16,
    method: &'static str,
    mode: &'static str,
    bytes: u64,
    bytes_received: u64,
    duration: f64,
    sni: Option<&'a str>,
    upstream: String,
    error: Option<&'a str>,
}

fn json_line(value: &impl Serialize) -> Vec<u8> {
    // serde_json escapes what a client sent (a path, an SNI name) into valid JSON:
    // quotes, control characters, and invalid UTF-8 never reach here (both are &str).
    let mut line = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    line.push(b'\n');
    line
}

/// What a client sent, made safe for a text line as nginx's `escape=default` does: `"`,
/// `\\`, control characters and every byte beyond ASCII written `\xHH`, so that no field
/// can end early, forge a line of its own, or turn a terminal's text around (U+202E).
struct Escaped<'a>(&'a str);

impl std::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for c in self.0.chars() {
            if c == '"' || c == '\\' || c.is_ascii_control() || !c.is_ascii() {
                for b in c.encode_utf8(&mut [0; 4]).bytes() {
                    write!(f, "\\x{b:02X}")?;
                }
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

fn protocol(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_11 => "HTTP/1.1",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP",
    }
}

/// A moment in UTC, written as nginx's `$time_local` (text: `28/Nov/2026:11:10:17
/// +0000`) or RFC 3339 with milliseconds (JSON).
struct Timestamp(SystemTime);

impl Timestamp {
    /// (year, month, day, hour, minute, second, millisecond).
    fn parts(&self) -> (i64, u32, u32, u64, u64, u64, u32) {
        let since = self
            .0
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let secs = since.as_secs();
        let (y, m, d) = civil_from_days((secs / 86_400) as i64);
        let t = secs % 86_400;
        (
            y,
            m,
            d,
            t / 3600,
            t / 60 % 60,
            t % 60,
            since.subsec_millis(),
        )
    }

    fn rfc3339(&self) -> String {
        let (y, mo, d, h, mi, s, ms) = self.parts();
        format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z")
    }
}

impl std::fmt::Display for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const MONTHS: [&str; 12] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        let (y, mo, d, h, mi, s, _) = self.parts();
        let month = MONTHS[(mo as usize).saturating_sub(1).min(11)];
        write!(f, "{d:02}/{month}/{y:04}:{h:02}:{mi:02}:{s:02} +0000")
    }
}

/// The proleptic Gregorian date of `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
pub(crate) fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64, millis: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(secs * 1000 + millis)
    }

    #[test]
    fn timestamps_match_known_dates() {
        // `date -u -d @...` for each.
        for (secs, rfc, text) in [
            (0, "1970-01-01T00:00:00.000Z", "01/Jan/1970:00:00:00 +0000"),
            (
                951_782_400,
                "2000-02-29T00:00:00.000Z",
                "29/Feb/2000:00:00:00 +0000",
            ),
            (
                1_796_037_017,
                "2026-11-30T11:10:17.000Z",
                "30/Nov/2026:11:10:17 +0000",
            ),
            (
                4_107_542_399,
                "2100-02-28T23:59:59.000Z",
                "28/Feb/2100:23:59:59 +0000",
            ),
        ] {
            assert_eq!(Timestamp(at(secs, 0)).rfc3339(), rfc);
            assert_eq!(Timestamp(at(secs, 0)).to_string(), text);
        }
        assert_eq!(
            Timestamp(at(0, 7)).rfc3339(),
            "1970-01-01T00:00:00.007Z",
            "milliseconds"
        );
    }

    fn request<'a>(
        path: &'a str,
        sni: Option<&'a str>,
        upstream: Option<&'a Upstreamed>,
    ) -> RequestLine<'a> {
        RequestLine {
            client: "[2001:db8::1]:40000".parse().unwrap(),
            method: "GET",
            path,
            version: Version::HTTP_11,
            status: 200,
            bytes: None,
            duration: Some(Duration::from_millis(12)),
            tls: Some(Tls {
                sni,
                version: "TLSv1.3",
                tenant: "default",
                client_verify: None,
                handshake: Duration::from_millis(3),
                crypto_wait: Duration::ZERO,
            }),
            upstream,
        }
    }

    #[test]
    fn json_lines_escape_what_clients_send_and_carry_every_field() {
        let up = Upstreamed {
            server: "127.0.0.1:9000".parse().unwrap(),
            status: 502,
            header_time: Duration::from_millis(250),
        };
        let nasty = "/a\"b\\c\u{1}\u{7f}é";
        let line = render_request(
            &request(nasty, Some("x\"y"), Some(&up)),
            LogFormat::Json,
            at(0, 0),
        );
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1, "one line");
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["path"], nasty);
        assert_eq!(v["sni"], "x\"y");
        assert_eq!(v["client"], "2001:db8::1");
        assert_eq!(v["client_port"], 40000);
        assert_eq!(v["bytes"], serde_json::Value::Null);
        assert_eq!(v["upstream"], "127.0.0.1:9000");
        assert_eq!(v["upstream_status"], 502);
        assert_eq!(v["upstream_time"], 0.25);
        assert_eq!(v["duration"], 0.012);
        assert_eq!(v["tls_version"], "TLSv1.3");
        assert_eq!(v["time"], "1970-01-01T00:00:00.000Z");
        let plain = render_request(
            &RequestLine {
                tls: None,
                ..request("/", None, None)
            },
            LogFormat::Json,
            at(0, 0),
        );
        let v: serde_json::Value = serde_json::from_slice(&plain).unwrap();
        assert_eq!(
            (&v["scheme"], &v["tls_version"]),
            (&"http".into(), &serde_json::Value::Null)
        );
    }

    #[test]
    fn text_lines_escape_what_could_end_a_field_or_forge_a_line() {
        let line = render_request(
            &request("/a\"b\\c\nfake 200\u{7f}é", Some("s\"n"), None),
            LogFormat::Text,
            at(0, 0),
        );
        let line = String::from_utf8(line).unwrap();
        assert_eq!(line.matches('\n').count(), 1, "{line}");
        assert!(
            line.contains(
                "\"GET /a\\x22b\\x5Cc\\x0Afake 200\\x7F\\xC3\\xA9 HTTP/1.1\" 200 - \"s\\x22n\""
            ),
            "{line}"
        );
    }

    #[test]
    fn text_lines_keep_nginx_shape() {
        let line = render_request(
            &request("/x", Some("a.test"), None),
            LogFormat::Text,
            at(0, 0),
        );
        let line = String::from_utf8(line).unwrap();
        assert!(
            line.starts_with("[2001:db8::1]:40000 [01/Jan/1970:00:00:00 +0000] \"GET /x HTTP/1.1\" 200 - \"a.test\" tls=TLSv1.3 tenant=default"),
            "{line}"
        );
        assert!(line.ends_with(" duration=0.0120\n"), "{line}");
    }
}
