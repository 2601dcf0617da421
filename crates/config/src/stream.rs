//! `[[stream]]`: connections whose SNI names a stream carry bytes to an upstream with no
//! HTTP in between, after terminus terminated their TLS (`mode = "terminate"`, with the
//! stream's certificates) or untouched (`mode = "passthrough"`, like nginx `ssl_preread`
//! or HAProxy `req.ssl_sni`: no key needed). Streams share the listeners with the
//! `[[server]]`s; SNI decides.

use serde::Deserialize;
use terminus_proxy::stream::StreamMode;
use terminus_proxy::UpstreamSpec;
use toml::Spanned;

use super::schema::CertificateSection;
use super::{ConfigError, Ctx};

/// A `[[stream]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamSection {
    pub names: Spanned<Vec<String>>,
    pub upstream: Spanned<String>,
    pub mode: Option<Spanned<String>>,
    #[serde(default)]
    pub certificate: Vec<CertificateSection>,
}

/// Where a stream's connections go, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamTarget {
    /// The `[[upstream]]`'s name.
    pub upstream: String,
    /// Whether terminus terminates TLS (the upstream gets the plaintext) or passes the
    /// connection through (the upstream answers the handshake).
    pub mode: StreamMode,
}

pub(super) fn resolve(
    s: &StreamSection,
    upstreams: &[UpstreamSpec],
    ctx: &Ctx<'_>,
) -> Result<StreamTarget, ConfigError> {
    let Some(upstream) = upstreams.iter().find(|u| &u.name == s.upstream.get_ref()) else {
        return Err(ctx.err(
            Some(s.upstream.span()),
            format!("no [[upstream]] is named {:?}", s.upstream.get_ref()),
            Some("define it: [[upstream]] name = ... servers = [...]".to_owned()),
        ));
    };
    if upstream.tls.is_some() {
        return Err(ctx.err(
            Some(s.upstream.span()),
            format!(
                "upstream {:?} has tls, but a stream's upstream is plain TCP",
                upstream.name
            ),
            Some("use mode = \"passthrough\" to hand the client's own TLS to the server, or an upstream without tls".to_owned()),
        ));
    }
    let mode = match s.mode.as_ref().map(|m| (m.get_ref().as_str(), m.span())) {
        None | Some(("terminate", _)) => StreamMode::Terminate,
        Some(("passthrough", _)) => StreamMode::Passthrough,
        Some((other, span)) => {
            return Err(ctx.err(
                Some(span),
                format!("mode = {other:?} is not a stream mode"),
                Some("use \"terminate\" (TLS ends here) or \"passthrough\" (the client's TLS goes to the server)".to_owned()),
            ))
        }
    };
    if let (StreamMode::Passthrough, Some(c)) = (mode, s.certificate.first()) {
        return Err(ctx.err(
            Some(c.cert.span()),
            "a passthrough stream takes no certificate: its server answers the handshake",
            None,
        ));
    }
    Ok(StreamTarget {
        upstream: upstream.name.clone(),
        mode,
    })
}

#[cfg(test)]
mod tests {
    use crate::{Config, Overrides};

    const UP: &str = "[[upstream]]\nname = \"db\"\nservers = [\"127.0.0.1:5432\"]\n";

    #[test]
    fn streams_become_hosts_with_their_upstream_and_mode() {
        let text = format!(
            "{UP}[[stream]]\nnames = [\"db.test\"]\nupstream = \"db\"\nmode = \"passthrough\"\n"
        );
        let c = Config::parse(&text, "t.toml", &Overrides::default()).unwrap();
        let stream = c.servers.iter().find(|s| s.names == ["db.test"]).unwrap();
        let target = stream.stream.as_ref().unwrap();
        assert_eq!(target.upstream, "db");
        assert_eq!(target.mode, terminus_proxy::stream::StreamMode::Passthrough);
        // The default HTTP server is still there for every other name.
        assert!(c.servers.iter().any(|s| s.default && s.stream.is_none()));
    }

    #[test]
    fn stream_mistakes_are_refused_at_their_line() {
        for (text, line, says) in [
            ("[[stream]]\nnames = [\"a.test\"]\nupstream = \"nope\"\n", 3, "no [[upstream]]"),
            ("[[stream]]\nnames = [\"a.test\"]\nupstream = \"db\"\nmode = \"proxy\"\n", 4, "not a stream mode"),
            ("[[stream]]\nnames = []\nupstream = \"db\"\n", 2, "at least one name"),
            ("[[stream]]\nnames = [\"a.test\"]\nupstream = \"db\"\nmode = \"passthrough\"\n[[stream.certificate]]\ncert = \"c.pem\"\nkey = \"k.pem\"\n", 6, "takes no certificate"),
            ("[[server]]\nnames = [\"a.test\"]\n[[stream]]\nnames = [\"A.test\"]\nupstream = \"db\"\n", 4, "already a name of the [[server]] at line 5"),
            ("[[stream]]\nnames = [\"a.test\"]\nupstream = \"db\"\nlisten = \"127.0.0.1:1\"\n", 4, "unknown field"),
        ] {
            let text = format!("{UP}{text}");
            let e = Config::parse(&text, "t.toml", &Overrides::default()).unwrap_err();
            assert_eq!(e.line.map(|l| l - 3), Some(line), "{text:?}: {e}");
            assert!(e.to_string().contains(says), "{text:?}: {e}");
        }
        let tls = "[[upstream]]\nname = \"s\"\nservers = [\"127.0.0.1:1\"]\ntls = { verify = false }\n[[stream]]\nnames = [\"a.test\"]\nupstream = \"s\"\n";
        let e = Config::parse(tls, "t.toml", &Overrides::default()).unwrap_err();
        assert!(e.to_string().contains("plain TCP"), "{e}");
    }
}
