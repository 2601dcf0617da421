//! Version checks on the ClientHello that rustls leaves to the server, and whether it
//! asks to resume (for the server's admission control: resumptions are cheap).
//!
//! rustls answers a client whose versions it does not share with `handshake_failure`, and
//! knows nothing of TLS_FALLBACK_SCSV. RFC 8446 (section 4.2.1, and 4.1.2 for clients
//! without `supported_versions`) asks for `protocol_version` there, and RFC 7507 asks a
//! server to refuse a client that says it fell back from a higher version the server
//! supports, with `inappropriate_fallback`: the defence against an attacker who breaks
//! connections to push a client down a version. Both need only the ClientHello's version
//! fields, which rustls's parsed `ClientHello` does not expose, so they are read here from
//! the record bytes the hello stage kept.

use rustls::{AlertDescription, ProtocolVersion};

use crate::record::whole_records;

/// RFC 7507's signalling cipher suite value.
const TLS_FALLBACK_SCSV: u16 = 0x5600;
const EXTENSION_SUPPORTED_VERSIONS: u16 = 43;
const EXTENSION_SESSION_TICKET: u16 = 35;
const EXTENSION_PRE_SHARED_KEY: u16 = 41;
const EXTENSION_PSK_KEY_EXCHANGE_MODES: u16 = 45;
const PSK_DHE_KE: u8 = 1;
const RECORD_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const TLS12: u16 = 0x0303;
const TLS13: u16 = 0x0304;

/// Why a ClientHello is refused before rustls sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Downgrade {
    /// No version the client offers is one this server has enabled.
    #[error("the client offers no TLS version this server has enabled")]
    NoCommonVersion,
    /// The client signalled a fallback (TLS_FALLBACK_SCSV) below a version this server
    /// would have negotiated.
    #[error("the client fell back (TLS_FALLBACK_SCSV) below the highest version this server has enabled")]
    InappropriateFallback,
}

impl Downgrade {
    pub(crate) fn alert(self) -> AlertDescription {
        match self {
            Self::NoCommonVersion => AlertDescription::ProtocolVersion,
            Self::InappropriateFallback => AlertDescription::InappropriateFallback,
        }
    }
}

/// What a ClientHello says about versions and resumption, read once per connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Offer {
    /// `supported_versions` if present, GREASE values left out.
    listed: Option<Vec<u16>>,
    /// `legacy_version`: with no `supported_versions`, the client does it and below, but
    /// nothing above TLS 1.2 (RFC 8446 section 4.2.1: such a client is a TLS 1.2 client,
    /// whatever its legacy_version says).
    legacy: u16,
    fallback: bool,
    /// TLS 1.3 pre_shared_key identities.
    psk_identities: Vec<Vec<u8>>,
    /// psk_key_exchange_modes lists psk_dhe_ke, the only mode rustls resumes with.
    psk_dhe: bool,
    /// A non-empty TLS 1.2 session ticket.
    ticket: Option<Vec<u8>>,
    /// The legacy session ID (a TLS 1.2 client's cached session; TLS 1.3 clients send a
    /// random one, which no cache holds).
    session_id: Vec<u8>,
}

impl Offer {
    fn accepts(&self, version: u16) -> bool {
        match &self.listed {
            Some(listed) => listed.contains(&version),
            None => version <= self.legacy.min(TLS12),
        }
    }

    fn highest(&self) -> u16 {
        match &self.listed {
            Some(listed) => listed.iter().copied().max().unwrap_or(0),
            None => self.legacy.min(TLS12),
        }
    }

    /// The refusal owed to this ClientHello given the versions this server has enabled;
    /// None when rustls may go on.
    pub(crate) fn refusal(&self, enabled: &[ProtocolVersion]) -> Option<Downgrade> {
        let enabled: Vec<u16> = enabled.iter().map(|v| u16::from(*v)).collect();
        if !enabled.iter().any(|v| self.accepts(*v)) {
            return Some(Downgrade::NoCommonVersion);
        }
        let ours = enabled.iter().copied().max()?;
        (self.fallback && self.highest() < ours).then_some(Downgrade::InappropriateFallback)
    }

    /// Whether the client offers a session this server can resume, in the version the
    /// handshake will have (the highest both have of `enabled`): over TLS 1.3 a
    /// pre_shared_key with psk_dhe_ke, over TLS 1.2 a session ticket or ID; and that one a
    /// ticket its ticketer decrypts or a session its cache holds. An offer of anything
    /// else (junk in a pre_shared_key, a TLS 1.2 ticket in a TLS 1.3 hello, a stale ticket)
    /// ends in a full handshake, and is one. Reading the offer costs an AEAD open or a
    /// cache look-up, a few µs at most; rustls repeats it.
    pub(crate) fn resumable_with(
        &self,
        config: &rustls::ServerConfig,
        enabled: &[ProtocolVersion],
    ) -> bool {
        let known = |id: &[u8]| !id.is_empty() && config.session_storage.get(id).is_some();
        let issued = |t: &[u8]| {
            (config.ticketer.enabled() && config.ticketer.decrypt(t).is_some()) || known(t)
        };
        let tls13 = enabled.contains(&ProtocolVersion::TLSv1_3) && self.accepts(TLS13);
        if tls13 {
            self.psk_dhe && self.psk_identities.iter().any(|t| issued(t))
        } else {
            self.ticket.as_deref().is_some_and(issued) || known(&self.session_id)
        }
    }
}

/// The refusal owed to the ClientHello at the head of `records` (whole TLS records, as the
/// hello stage read them), given the versions this server has enabled; None when rustls
/// may go on, including when the bytes do not parse (rustls has accepted them, and judges
/// them itself).
pub(crate) fn check(records: &[u8], enabled: &[ProtocolVersion]) -> Option<Downgrade> {
    parse(records)?.refusal(enabled)
}

/// The ClientHello at the head of `records`; None when the bytes do not parse.
pub(crate) fn parse(records: &[u8]) -> Option<Offer> {
    let message = handshake_message(records)?;
    let mut r = Reader(&message);
    if r.u8()? != HANDSHAKE_CLIENT_HELLO {
        return None;
    }
    let mut body = Reader(r.vec(3)?);
    let legacy = body.u16()?;
    body.take(32)?;
    let session_id = body.vec(1)?.to_vec();
    let mut suites = Reader(body.vec(2)?);
    let mut fallback = false;
    while let Some(suite) = suites.u16() {
        fallback |= suite == TLS_FALLBACK_SCSV;
    }
    body.vec(1)?;
    let mut listed = None;
    let (mut psk_identities, mut psk_dhe, mut ticket) = (Vec::new(), false, None);
    if let Some(extensions) = body.vec(2) {
        let mut extensions = Reader(extensions);
        while let Some(kind) = extensions.u16() {
            let data = extensions.vec(2)?;
            if kind == EXTENSION_SESSION_TICKET && !data.is_empty() {
                ticket = Some(data.to_vec());
            }
            if kind == EXTENSION_PRE_SHARED_KEY {
                // identities<7..2^16-1>: identity<1..2^16-1>, obfuscated_ticket_age u32.
                let mut identities = Reader(Reader(data).vec(2)?);
                while let Some(identity) = identities.vec(2) {
                    psk_identities.push(identity.to_vec());
                    identities.take(4)?;
                }
            }
            if kind == EXTENSION_PSK_KEY_EXCHANGE_MODES {
                psk_dhe = Reader(data).vec(1)?.contains(&PSK_DHE_KE);
            }
            if kind == EXTENSION_SUPPORTED_VERSIONS {
                let mut list = Reader(Reader(data).vec(1)?);
                let mut versions = Vec::new();
                while let Some(v) = list.u16() {
                    if !is_grease(v) {
                        versions.push(v);
                    }
                }
                listed = Some(versions);
            }
        }
    }
    Some(Offer {
        listed,
        legacy,
        fallback,
        psk_identities,
        psk_dhe,
        ticket,
        session_id,
    })
}

/// The first handshake message, joined from the handshake records it spans.
fn handshake_message(records: &[u8]) -> Option<Vec<u8>> {
    let whole = whole_records(records);
    let mut r = Reader(&records[..whole]);
    let mut message = Vec::new();
    while let Some(kind) = r.u8() {
        r.u16()?;
        let fragment = r.vec(2)?;
        if kind != RECORD_HANDSHAKE {
            break;
        }
        message.extend_from_slice(fragment);
        if message.len() >= 4 {
            let len = u32::from_be_bytes([0, message[1], message[2], message[3]]) as usize;
            if message.len() >= 4 + len {
                message.truncate(4 + len);
                return Some(message);
            }
        }
    }
    None
}

/// RFC 8701: 0x?A?A with both bytes equal.
fn is_grease(v: u16) -> bool {
    v & 0x0f0f == 0x0a0a && v >> 8 == v & 0xff
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn u16(&mut self) -> Option<u16> {
        let b = self.take(2)?;
        Some(u16::from_be_bytes([b[0], b[1]]))
    }

    /// A vector with a `len_bytes`-byte length in front.
    fn vec(&mut self, len_bytes: usize) -> Option<&'a [u8]> {
        let len = self
            .take(len_bytes)?
            .iter()
            .fold(0usize, |n, b| n << 8 | *b as usize);
        self.take(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello in records of at most `fragment` bytes.
    fn hello(legacy: u16, suites: &[u16], versions: Option<&[u16]>, fragment: usize) -> Vec<u8> {
        hello_with(legacy, suites, versions, fragment, &[])
    }

    /// [`hello`] with `extra` extensions (type, data) after the others.
    fn hello_with(
        legacy: u16,
        suites: &[u16],
        versions: Option<&[u16]>,
        fragment: usize,
        extra: &[(u16, &[u8])],
    ) -> Vec<u8> {
        let mut body = legacy.to_be_bytes().to_vec();
        body.extend([7u8; 32]);
        body.push(0);
        body.extend(((suites.len() * 2) as u16).to_be_bytes());
        for s in suites {
            body.extend(s.to_be_bytes());
        }
        body.extend([1, 0]);
        let mut extensions = Vec::new();
        // server_name, to have an extension before the one read.
        extensions.extend([0, 0, 0, 0]);
        if let Some(versions) = versions {
            extensions.extend(EXTENSION_SUPPORTED_VERSIONS.to_be_bytes());
            extensions.extend(((versions.len() * 2 + 1) as u16).to_be_bytes());
            extensions.push((versions.len() * 2) as u8);
            for v in versions {
                extensions.extend(v.to_be_bytes());
            }
        }
        for (kind, data) in extra {
            extensions.extend(kind.to_be_bytes());
            extensions.extend((data.len() as u16).to_be_bytes());
            extensions.extend(*data);
        }
        body.extend((extensions.len() as u16).to_be_bytes());
        body.extend(extensions);
        let mut message = vec![HANDSHAKE_CLIENT_HELLO];
        message.extend(&(body.len() as u32).to_be_bytes()[1..]);
        message.extend(body);
        let mut records = Vec::new();
        for chunk in message.chunks(fragment) {
            records.extend([RECORD_HANDSHAKE, 3, 1]);
            records.extend((chunk.len() as u16).to_be_bytes());
            records.extend(chunk);
        }
        records
    }

    fn versions(v: &[u16]) -> Vec<ProtocolVersion> {
        v.iter().map(|v| ProtocolVersion::from(*v)).collect()
    }

    #[test]
    fn only_a_ticket_or_session_this_server_issued_is_resumable() {
        let mut config = crate::TlsSettings::default()
            .server_config(
                std::sync::Arc::new(crate::SniResolver::new(Vec::new(), 0)),
                std::sync::Arc::new(terminus_fleet::tickets::Ticketer::local(Default::default())),
            )
            .map(|c| (*c).clone())
            .expect("a server config");
        config.session_storage = rustls::server::ServerSessionMemoryCache::new(16);
        let ticket = config.ticketer.encrypt(b"a session").expect("a ticket");
        config
            .session_storage
            .put(b"cached-id".to_vec(), b"state".to_vec());
        let psk = |identity: &[u8]| {
            let mut ext = ((identity.len() + 6) as u16).to_be_bytes().to_vec();
            ext.extend((identity.len() as u16).to_be_bytes());
            ext.extend(identity);
            ext.extend([0, 0, 0, 0]);
            ext.extend([0, 33, 32]);
            ext.extend([0; 32]);
            ext
        };
        const MODES: &[u8] = &[1, PSK_DHE_KE];
        let both = versions(&[TLS13, TLS12]);
        // A TLS 1.3 client (psk_dhe_ke offered) against both versions, or against 1.2 only.
        let offer = |enabled: &[ProtocolVersion], extra: &[(u16, &[u8])]| {
            let mut extra = extra.to_vec();
            extra.push((EXTENSION_PSK_KEY_EXCHANGE_MODES, MODES));
            let h = hello_with(TLS12, &[0x1301], Some(&[TLS13, TLS12]), 200, &extra);
            parse(&h)
                .expect("a ClientHello")
                .resumable_with(&config, enabled)
        };
        let resumable = |extra: &[(u16, &[u8])]| offer(&both, extra);
        assert!(!resumable(&[]));
        assert!(resumable(&[(EXTENSION_PRE_SHARED_KEY, &psk(&ticket))]));
        assert!(resumable(&[(EXTENSION_PRE_SHARED_KEY, &psk(b"cached-id"))]));
        // Junk, a forged ticket, or a ticket of another server: a full handshake.
        assert!(!resumable(&[(
            EXTENSION_PRE_SHARED_KEY,
            &psk(&[1, 2, 3, 4])
        )]));
        let mut forged = ticket.clone();
        *forged.last_mut().unwrap() ^= 1;
        assert!(!resumable(&[(EXTENSION_PRE_SHARED_KEY, &psk(&forged))]));
        let other = terminus_fleet::tickets::Ticketer::local(Default::default());
        let foreign = rustls::server::ProducesTickets::encrypt(&other, b"a session").unwrap();
        assert!(!resumable(&[(EXTENSION_PRE_SHARED_KEY, &psk(&foreign))]));
        // A genuine ticket where the handshake will not take it: a TLS 1.2 ticket in a
        // hello that will be TLS 1.3, a PSK without psk_dhe_ke.
        assert!(!resumable(&[(EXTENSION_SESSION_TICKET, &ticket)]));
        let h = hello_with(
            TLS12,
            &[0x1301],
            Some(&[TLS13, TLS12]),
            200,
            &[(EXTENSION_PRE_SHARED_KEY, &psk(&ticket))],
        );
        assert!(!parse(&h).unwrap().resumable_with(&config, &both));
        // Over TLS 1.2 (the server has no 1.3): the ticket or the cached session ID.
        let tls12 = versions(&[TLS12]);
        assert!(offer(&tls12, &[(EXTENSION_SESSION_TICKET, &ticket)]));
        assert!(!offer(&tls12, &[(EXTENSION_SESSION_TICKET, &foreign)]));
        assert!(!offer(&tls12, &[(EXTENSION_SESSION_TICKET, &[9; 100])]));
        assert!(!offer(&tls12, &[(EXTENSION_PRE_SHARED_KEY, &psk(&ticket))]));
        // Sent empty by a client that can take a ticket but has none.
        assert!(!offer(&tls12, &[(EXTENSION_SESSION_TICKET, &[])]));
        assert_eq!(parse(&[22, 3, 1, 0, 1, 1]), None, "not a ClientHello");
    }

    #[test]
    fn a_tls13_client_passes() {
        let h = hello(TLS12, &[0x1301], Some(&[0x1a1a, TLS13, TLS12]), 1 << 14);
        assert_eq!(check(&h, &versions(&[TLS13, TLS12])), None);
        assert_eq!(check(&h, &versions(&[TLS12])), None);
    }

    #[test]
    fn a_client_below_every_enabled_version_gets_protocol_version() {
        let tls11 = hello(0x0302, &[0xc013], None, 1 << 14);
        assert_eq!(
            check(&tls11, &versions(&[TLS13, TLS12])),
            Some(Downgrade::NoCommonVersion)
        );
        let only13 = hello(TLS12, &[0x1301], Some(&[TLS13]), 1 << 14);
        assert_eq!(
            check(&only13, &versions(&[TLS12])),
            Some(Downgrade::NoCommonVersion)
        );
        // TLS 1.2 without supported_versions, to a TLS 1.3-only server.
        let tls12 = hello(TLS12, &[0xc02f], None, 1 << 14);
        assert_eq!(
            check(&tls12, &versions(&[TLS13])),
            Some(Downgrade::NoCommonVersion)
        );
        assert_eq!(
            Downgrade::NoCommonVersion.alert(),
            AlertDescription::ProtocolVersion
        );
    }

    #[test]
    fn a_fallback_below_our_highest_is_refused_wherever_the_scsv_sits() {
        for at in 0..3 {
            let mut suites = vec![0xc02f, 0xc030];
            suites.insert(at, TLS_FALLBACK_SCSV);
            let h = hello(TLS12, &suites, None, 1 << 14);
            assert_eq!(
                check(&h, &versions(&[TLS13, TLS12])),
                Some(Downgrade::InappropriateFallback),
                "SCSV at {at}"
            );
            // Not a downgrade where TLS 1.2 is the most this server does.
            assert_eq!(check(&h, &versions(&[TLS12])), None);
        }
        // legacy_version 3.4 without supported_versions is a TLS 1.2 client (RFC 8446
        // section 4.2.1), so its fallback is below TLS 1.3.
        let legacy34 = hello(TLS13, &[TLS_FALLBACK_SCSV, 0xc02f], None, 1 << 14);
        assert_eq!(
            check(&legacy34, &versions(&[TLS13, TLS12])),
            Some(Downgrade::InappropriateFallback)
        );
        let with13 = hello(
            TLS12,
            &[TLS_FALLBACK_SCSV, 0x1301],
            Some(&[TLS13, TLS12]),
            1 << 14,
        );
        assert_eq!(check(&with13, &versions(&[TLS13, TLS12])), None);
    }

    #[test]
    fn a_hello_split_across_records_is_joined() {
        let h = hello(TLS12, &[TLS_FALLBACK_SCSV, 0xc02f], None, 7);
        assert_eq!(
            check(&h, &versions(&[TLS13, TLS12])),
            Some(Downgrade::InappropriateFallback)
        );
    }

    #[test]
    fn bytes_that_do_not_parse_are_left_to_rustls() {
        let h = hello(TLS12, &[TLS_FALLBACK_SCSV], None, 1 << 14);
        for cut in [0, 5, 20, h.len() - 1] {
            assert_eq!(
                check(&h[..cut], &versions(&[TLS13, TLS12])),
                None,
                "cut {cut}"
            );
        }
        assert_eq!(check(b"GET / HTTP/1.1\r\n\r\n", &versions(&[TLS13])), None);
    }
}
