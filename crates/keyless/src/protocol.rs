//! The keyless protocol on the wire, as Cloudflare's gokeyless speaks it (version 1.0):
//!
//! ```text
//! header:  | major (1) | minor (0) | body length: u16 | request ID: u32 |   big endian
//! item:    | tag: u8 | length: u16 | data |
//! ```
//!
//! A request's body holds an opcode item (which signature: RSA PKCS#1 v1.5, RSA-PSS or
//! ECDSA, and its hash), a payload item (the digest to sign), the key's identity (its
//! Subject Key Identifier, the SHA-1 of its public key's bits, as gokeyless looks keys
//! up; or the SHA-256 of an RSA modulus, the protocol's older identity) and optional
//! context (SNI, the client's and server's addresses), padded to 1,024 bytes. An answer
//! holds an opcode item (`0xF0` success, `0xFF` error) and a payload (the signature, or
//! a one-byte error code).
//!
//! Decoding is strict where gokeyless is lenient (a body that does not end on an item's
//! end is an error here, not ignored); unknown tags are skipped, as gokeyless skips them,
//! so that either side may add context the other does not read.

use std::fmt;

/// The header's size.
pub const HEADER_LEN: usize = 8;

/// The protocol version this speaks.
pub const VERSION: (u8, u8) = (1, 0);

/// gokeyless pads every request to this many bytes (header included), so that the size
/// of a request on the wire says nothing of what it asks.
pub const PADDED_LEN: usize = 1024;

/// Item tags.
pub mod tag {
    /// SHA-256 of the RSA modulus (the protocol's older key identity).
    pub const CERTIFICATE_DIGEST: u8 = 0x01;
    /// The handshake's SNI.
    pub const SERVER_NAME: u8 = 0x02;
    /// The TLS client's address (4 or 16 bytes).
    pub const CLIENT_IP: u8 = 0x03;
    /// SHA-1 of the public key's bits (RFC 5280 4.2.1.2 method 1): which key to use.
    pub const SUBJECT_KEY_IDENTIFIER: u8 = 0x04;
    /// The terminator's address the client connected to (4 or 16 bytes).
    pub const SERVER_IP: u8 = 0x05;
    /// An identifier of the certificate (opaque).
    pub const CERT_ID: u8 = 0x06;
    /// The operation, or an answer's status.
    pub const OPCODE: u8 = 0x11;
    /// What to sign; an answer's signature or error code.
    pub const PAYLOAD: u8 = 0x12;
    /// Filler to [`super::PADDED_LEN`].
    pub const PADDING: u8 = 0x20;
}

/// A signature hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hash {
    /// SHA-256.
    Sha256,
    /// SHA-384.
    Sha384,
    /// SHA-512.
    Sha512,
}

impl Hash {
    /// The digest's length.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(self) -> usize {
        match self {
            Hash::Sha256 => 32,
            Hash::Sha384 => 48,
            Hash::Sha512 => 64,
        }
    }
}

/// A signing operation terminus performs. The protocol's other operations (RSA
/// decryption for TLS 1.2's RSA key exchange, MD5-SHA1 and SHA-1 signatures, seal/unseal,
/// RPC) are answered with [`ErrorCode::BadOpcode`]: no TLS version terminus negotiates
/// needs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sign {
    /// RSASSA-PKCS1-v1_5 (TLS 1.2's `rsa_pkcs1_*`).
    RsaPkcs1(Hash),
    /// RSASSA-PSS with MGF1 of the same hash and a salt as long as the digest (TLS 1.3's
    /// `rsa_pss_rsae_*`).
    RsaPss(Hash),
    /// ECDSA, the signature DER-encoded (`ecdsa_secp256r1_sha256`,
    /// `ecdsa_secp384r1_sha384`).
    Ecdsa(Hash),
}

/// An item's opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A signature.
    Sign(Sign),
    /// Are you there (its payload echoed).
    Ping,
    /// The answer to a ping.
    Pong,
    /// A successful answer.
    Response,
    /// A failed answer; the payload is its [`ErrorCode`].
    Error,
    /// Anything else: answered with [`ErrorCode::BadOpcode`].
    Other(u8),
}

impl Op {
    /// A short name for logs: `rsa_pss_sha256`, `ecdsa_sha384`, `ping`...
    pub fn name(self) -> &'static str {
        use Hash::*;
        match self {
            Op::Sign(Sign::RsaPkcs1(Sha256)) => "rsa_pkcs1_sha256",
            Op::Sign(Sign::RsaPkcs1(Sha384)) => "rsa_pkcs1_sha384",
            Op::Sign(Sign::RsaPkcs1(Sha512)) => "rsa_pkcs1_sha512",
            Op::Sign(Sign::RsaPss(Sha256)) => "rsa_pss_sha256",
            Op::Sign(Sign::RsaPss(Sha384)) => "rsa_pss_sha384",
            Op::Sign(Sign::RsaPss(Sha512)) => "rsa_pss_sha512",
            Op::Sign(Sign::Ecdsa(Sha256)) => "ecdsa_sha256",
            Op::Sign(Sign::Ecdsa(Sha384)) => "ecdsa_sha384",
            Op::Sign(Sign::Ecdsa(Sha512)) => "ecdsa_sha512",
            Op::Ping => "ping",
            Op::Pong => "pong",
            Op::Response => "response",
            Op::Error => "error",
            Op::Other(_) => "other",
        }
    }

    /// The byte on the wire.
    pub fn code(self) -> u8 {
        use Hash::*;
        match self {
            Op::Sign(Sign::RsaPkcs1(Sha256)) => 0x05,
            Op::Sign(Sign::RsaPkcs1(Sha384)) => 0x06,
            Op::Sign(Sign::RsaPkcs1(Sha512)) => 0x07,
            Op::Sign(Sign::Ecdsa(Sha256)) => 0x15,
            Op::Sign(Sign::Ecdsa(Sha384)) => 0x16,
            Op::Sign(Sign::Ecdsa(Sha512)) => 0x17,
            Op::Sign(Sign::RsaPss(Sha256)) => 0x35,
            Op::Sign(Sign::RsaPss(Sha384)) => 0x36,
            Op::Sign(Sign::RsaPss(Sha512)) => 0x37,
            Op::Response => 0xF0,
            Op::Ping => 0xF1,
            Op::Pong => 0xF2,
            Op::Error => 0xFF,
            Op::Other(code) => code,
        }
    }

    /// The opcode of a byte on the wire.
    pub fn from_code(code: u8) -> Op {
        use Hash::*;
        match code {
            0x05 => Op::Sign(Sign::RsaPkcs1(Sha256)),
            0x06 => Op::Sign(Sign::RsaPkcs1(Sha384)),
            0x07 => Op::Sign(Sign::RsaPkcs1(Sha512)),
            0x15 => Op::Sign(Sign::Ecdsa(Sha256)),
            0x16 => Op::Sign(Sign::Ecdsa(Sha384)),
            0x17 => Op::Sign(Sign::Ecdsa(Sha512)),
            0x35 => Op::Sign(Sign::RsaPss(Sha256)),
            0x36 => Op::Sign(Sign::RsaPss(Sha384)),
            0x37 => Op::Sign(Sign::RsaPss(Sha512)),
            0xF0 => Op::Response,
            0xF1 => Op::Ping,
            0xF2 => Op::Pong,
            0xFF => Op::Error,
            other => Op::Other(other),
        }
    }
}

/// An error answer's one-byte payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ErrorCode {
    /// The signature could not be made.
    #[error("cryptography failure")]
    CryptoFailed,
    /// No key of that identity here.
    #[error("key not found")]
    KeyNotFound,
    /// Reading the request failed.
    #[error("read error")]
    Read,
    /// A protocol version this side does not speak.
    #[error("version mismatch")]
    VersionMismatch,
    /// An operation this side does not perform.
    #[error("bad opcode")]
    BadOpcode,
    /// An answer's opcode in a request.
    #[error("unexpected opcode")]
    UnexpectedOpcode,
    /// A malformed message.
    #[error("format error")]
    Format,
    /// Something else went wrong on the signer.
    #[error("internal error")]
    Internal,
    /// No certificate of that ID.
    #[error("certificate not found")]
    CertNotFound,
    /// The request waited past its deadline.
    #[error("request expired")]
    Expired,
    /// A code this side does not know.
    #[error("error {0:#04x}")]
    Other(u8),
}

impl ErrorCode {
    /// A short name for logs and metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::CryptoFailed => "crypto_failed",
            ErrorCode::KeyNotFound => "key_not_found",
            ErrorCode::Read => "read",
            ErrorCode::VersionMismatch => "version_mismatch",
            ErrorCode::BadOpcode => "bad_opcode",
            ErrorCode::UnexpectedOpcode => "unexpected_opcode",
            ErrorCode::Format => "format",
            ErrorCode::Internal => "internal",
            ErrorCode::CertNotFound => "cert_not_found",
            ErrorCode::Expired => "expired",
            ErrorCode::Other(_) => "other",
        }
    }

    /// The byte on the wire.
    pub fn code(self) -> u8 {
        match self {
            ErrorCode::CryptoFailed => 0x01,
            ErrorCode::KeyNotFound => 0x02,
            ErrorCode::Read => 0x03,
            ErrorCode::VersionMismatch => 0x04,
            ErrorCode::BadOpcode => 0x05,
            ErrorCode::UnexpectedOpcode => 0x06,
            ErrorCode::Format => 0x07,
            ErrorCode::Internal => 0x08,
            ErrorCode::CertNotFound => 0x09,
            ErrorCode::Expired => 0x0A,
            ErrorCode::Other(code) => code,
        }
    }

    /// The error of a byte on the wire.
    pub fn from_code(code: u8) -> ErrorCode {
        match code {
            0x01 => ErrorCode::CryptoFailed,
            0x02 => ErrorCode::KeyNotFound,
            0x03 => ErrorCode::Read,
            0x04 => ErrorCode::VersionMismatch,
            0x05 => ErrorCode::BadOpcode,
            0x06 => ErrorCode::UnexpectedOpcode,
            0x07 => ErrorCode::Format,
            0x08 => ErrorCode::Internal,
            0x09 => ErrorCode::CertNotFound,
            0x0A => ErrorCode::Expired,
            other => ErrorCode::Other(other),
        }
    }
}

/// The key a request names.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyId {
    /// SHA-1 of the public key's bits.
    Ski([u8; 20]),
    /// SHA-256 of the RSA modulus.
    ModulusDigest([u8; 32]),
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, bytes): (&str, &[u8]) = match self {
            KeyId::Ski(b) => ("ski", b),
            KeyId::ModulusDigest(b) => ("modulus-sha256", b),
        };
        write!(f, "{name}:")?;
        for b in bytes {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// One message: a request, an answer, a ping or a pong. Only what terminus reads or
/// writes is kept; unknown items are skipped when decoding.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Message {
    /// Matches an answer to its request.
    pub id: u32,
    /// What is asked, or how it went.
    pub op: Option<Op>,
    /// The digest to sign; the signature; an error's code; a ping's data.
    pub payload: Vec<u8>,
    /// Which key.
    pub key: Option<KeyId>,
    /// The handshake's SNI (for the signer's audit log).
    pub server_name: Option<String>,
    /// The TLS client's address (likewise).
    pub client_ip: Option<std::net::IpAddr>,
    /// The terminator's address the client reached (likewise).
    pub server_ip: Option<std::net::IpAddr>,
}

/// Why bytes are not a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Another major version.
    #[error("version {0}.{1}, not 1.x")]
    Version(u8, u8),
    /// An item runs past the body.
    #[error("an item's length runs past the body's end")]
    Truncated,
    /// A tag appears twice.
    #[error("tag {0:#04x} appears twice")]
    Repeated(u8),
    /// An item of a length its tag cannot have.
    #[error("tag {tag:#04x} is {len} bytes, which it cannot be")]
    BadLength {
        /// The item's tag.
        tag: u8,
        /// Its length.
        len: usize,
    },
    /// The SNI is not UTF-8.
    #[error("the server name is not UTF-8")]
    ServerName,
    /// No opcode item.
    #[error("no opcode")]
    NoOpcode,
}

impl DecodeError {
    /// What the signer answers such a request with.
    pub fn answer(&self) -> ErrorCode {
        match self {
            DecodeError::Version(..) => ErrorCode::VersionMismatch,
            _ => ErrorCode::Format,
        }
    }
}

/// A header read from the first [`HEADER_LEN`] bytes: the version is checked when the
/// body is decoded, so that a request of another version can still be answered by ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The major version (1).
    pub major: u8,
    /// The minor version (0).
    pub minor: u8,
    /// The body's length after the header.
    pub body_len: u16,
    /// The request's ID.
    pub id: u32,
}

impl Header {
    /// The header in `bytes`.
    pub fn parse(bytes: &[u8; HEADER_LEN]) -> Header {
        Header {
            major: bytes[0],
            minor: bytes[1],
            body_len: u16::from_be_bytes([bytes[2], bytes[3]]),
            id: u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
        }
    }
}

impl Message {
    /// A signing request for `key`.
    pub fn sign(id: u32, sign: Sign, key: KeyId, digest: Vec<u8>) -> Message {
        Message {
            id,
            op: Some(Op::Sign(sign)),
            payload: digest,
            key: Some(key),
            ..Message::default()
        }
    }

    /// A successful answer to request `id`.
    pub fn response(id: u32, payload: Vec<u8>) -> Message {
        Message {
            id,
            op: Some(Op::Response),
            payload,
            ..Message::default()
        }
    }

    /// An error answer to request `id`.
    pub fn error(id: u32, code: ErrorCode) -> Message {
        Message {
            id,
            op: Some(Op::Error),
            payload: vec![code.code()],
            ..Message::default()
        }
    }

    /// The message on the wire; padded to [`PADDED_LEN`] when `pad` (requests, as
    /// gokeyless sends them). None when an item or the body is longer than a u16 says.
    pub fn encode(&self, pad: bool) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(if pad {
            PADDED_LEN
        } else {
            64 + self.payload.len()
        });
        out.extend_from_slice(&[VERSION.0, VERSION.1, 0, 0]);
        out.extend_from_slice(&self.id.to_be_bytes());
        fn item(out: &mut Vec<u8>, tag: u8, data: &[u8]) -> Option<()> {
            out.push(tag);
            out.extend_from_slice(&u16::try_from(data.len()).ok()?.to_be_bytes());
            out.extend_from_slice(data);
            Some(())
        }
        if let Some(op) = self.op {
            item(&mut out, tag::OPCODE, &[op.code()])?;
        }
        if !self.payload.is_empty() {
            item(&mut out, tag::PAYLOAD, &self.payload)?;
        }
        match &self.key {
            Some(KeyId::Ski(ski)) => item(&mut out, tag::SUBJECT_KEY_IDENTIFIER, ski)?,
            Some(KeyId::ModulusDigest(digest)) => item(&mut out, tag::CERTIFICATE_DIGEST, digest)?,
            None => {}
        }
        for (tag, ip) in [
            (tag::CLIENT_IP, self.client_ip),
            (tag::SERVER_IP, self.server_ip),
        ] {
            match ip {
                Some(std::net::IpAddr::V4(v4)) => item(&mut out, tag, &v4.octets())?,
                Some(std::net::IpAddr::V6(v6)) => item(&mut out, tag, &v6.octets())?,
                None => {}
            }
        }
        if let Some(name) = &self.server_name {
            item(&mut out, tag::SERVER_NAME, name.as_bytes())?;
        }
        if pad && out.len() + 3 < PADDED_LEN {
            let fill = vec![0u8; PADDED_LEN - out.len() - 3];
            item(&mut out, tag::PADDING, &fill)?;
        }
        let body = u16::try_from(out.len() - HEADER_LEN).ok()?;
        out[2..4].copy_from_slice(&body.to_be_bytes());
        Some(out)
    }

    /// The message of `header` and its `body` (exactly `header.body_len` bytes).
    pub fn decode(header: Header, body: &[u8]) -> Result<Message, DecodeError> {
        if header.major != VERSION.0 {
            return Err(DecodeError::Version(header.major, header.minor));
        }
        let mut message = Message {
            id: header.id,
            ..Message::default()
        };
        let mut seen = [false; 256];
        let mut rest = body;
        while !rest.is_empty() {
            let [tag, hi, lo, ..] = *rest else {
                return Err(DecodeError::Truncated);
            };
            let len = usize::from(u16::from_be_bytes([hi, lo]));
            let data = rest.get(3..3 + len).ok_or(DecodeError::Truncated)?;
            rest = &rest[3 + len..];
            if std::mem::replace(&mut seen[usize::from(tag)], true) && tag != tag::PADDING {
                return Err(DecodeError::Repeated(tag));
            }
            let bad = || DecodeError::BadLength { tag, len };
            match tag {
                tag::OPCODE => {
                    let [code] = *data else { return Err(bad()) };
                    message.op = Some(Op::from_code(code));
                }
                tag::PAYLOAD => message.payload = data.to_vec(),
                tag::SUBJECT_KEY_IDENTIFIER => {
                    message.key = Some(KeyId::Ski(data.try_into().map_err(|_| bad())?));
                }
                tag::CERTIFICATE_DIGEST => {
                    // A request naming its key both ways: the SKI is gokeyless's first
                    // choice, and the one kept.
                    let digest = KeyId::ModulusDigest(data.try_into().map_err(|_| bad())?);
                    if message.key.is_none() {
                        message.key = Some(digest);
                    }
                }
                tag::CLIENT_IP | tag::SERVER_IP => {
                    let ip = match data.len() {
                        4 => std::net::IpAddr::from(<[u8; 4]>::try_from(data).map_err(|_| bad())?),
                        16 => {
                            std::net::IpAddr::from(<[u8; 16]>::try_from(data).map_err(|_| bad())?)
                        }
                        _ => return Err(bad()),
                    };
                    if tag == tag::CLIENT_IP {
                        message.client_ip = Some(ip);
                    } else {
                        message.server_ip = Some(ip);
                    }
                }
                tag::SERVER_NAME => {
                    message.server_name = Some(
                        String::from_utf8(data.to_vec()).map_err(|_| DecodeError::ServerName)?,
                    );
                }
                // Padding, and what gokeyless may add that terminus does not read.
                _ => {}
            }
        }
        if message.op.is_none() {
            return Err(DecodeError::NoOpcode);
        }
        Ok(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn split(bytes: &[u8]) -> (Header, &[u8]) {
        let header = Header::parse(bytes[..HEADER_LEN].try_into().unwrap());
        (header, &bytes[HEADER_LEN..])
    }

    #[test]
    fn a_request_is_padded_to_gokeyless_size_and_reads_back() {
        let request = Message {
            server_name: Some("example.com".into()),
            client_ip: Some("192.0.2.7".parse().unwrap()),
            server_ip: Some("2001:db8::1".parse().unwrap()),
            ..Message::sign(
                7,
                Sign::RsaPss(Hash::Sha256),
                KeyId::Ski([9; 20]),
                vec![1; 32],
            )
        };
        let bytes = request.encode(true).unwrap();
        assert_eq!(bytes.len(), PADDED_LEN);
        assert_eq!(&bytes[..2], &[1, 0]);
        let (header, body) = split(&bytes);
        assert_eq!(usize::from(header.body_len), body.len());
        assert_eq!(header.id, 7);
        assert_eq!(Message::decode(header, body).unwrap(), request);
    }

    #[test]
    fn bytes_as_gokeyless_writes_them_decode() {
        // An ECDSA-SHA256 request as gokeyless's MarshalBinary orders its items: opcode,
        // payload, SKI (then padding, left out here), built by hand from protocol.md.
        let mut body = vec![
            0x11, 0, 1, 0x15, 0x12, 0, 4, 0xde, 0xad, 0xbe, 0xef, 0x04, 0, 20,
        ];
        body.extend_from_slice(&[0xab; 20]);
        body.extend_from_slice(&[0x99, 0, 2, 1, 2]); // a tag terminus does not know
        let mut bytes = vec![1, 0];
        bytes.extend_from_slice(&(body.len() as u16).to_be_bytes());
        bytes.extend_from_slice(&0x0102_0304u32.to_be_bytes());
        bytes.extend_from_slice(&body);
        let (header, body) = split(&bytes);
        let m = Message::decode(header, body).unwrap();
        assert_eq!(m.id, 0x0102_0304);
        assert_eq!(m.op, Some(Op::Sign(Sign::Ecdsa(Hash::Sha256))));
        assert_eq!(m.payload, [0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(m.key, Some(KeyId::Ski([0xab; 20])));
    }

    #[test]
    fn malformed_bodies_are_refused_with_what_is_wrong() {
        let header = |len: usize| Header {
            major: 1,
            minor: 0,
            body_len: len as u16,
            id: 1,
        };
        for (body, want) in [
            (&[0x11, 0, 2, 1][..], DecodeError::Truncated),
            (&[0x11, 0][..], DecodeError::Truncated),
            (
                &[0x11, 0, 1, 0x05, 0x11, 0, 1, 0x05][..],
                DecodeError::Repeated(0x11),
            ),
            (
                &[0x11, 0, 2, 0x05, 0x05][..],
                DecodeError::BadLength { tag: 0x11, len: 2 },
            ),
            (
                &[0x04, 0, 1, 0][..],
                DecodeError::BadLength { tag: 0x04, len: 1 },
            ),
            (
                &[0x03, 0, 3, 1, 2, 3][..],
                DecodeError::BadLength { tag: 0x03, len: 3 },
            ),
            (&[0x12, 0, 1, 7][..], DecodeError::NoOpcode),
        ] {
            assert_eq!(
                Message::decode(header(body.len()), body),
                Err(want),
                "{body:?}"
            );
        }
        let v2 = Header {
            major: 2,
            ..header(0)
        };
        assert_eq!(Message::decode(v2, &[]), Err(DecodeError::Version(2, 0)));
        assert_eq!(
            DecodeError::Version(2, 0).answer(),
            ErrorCode::VersionMismatch
        );
    }

    #[test]
    fn every_opcode_and_error_code_reads_back_as_written() {
        for code in 0..=255u8 {
            assert_eq!(Op::from_code(code).code(), code);
            assert_eq!(ErrorCode::from_code(code).code(), code);
        }
    }

    fn arb_message() -> impl Strategy<Value = Message> {
        (
            any::<u32>(),
            any::<u8>(),
            proptest::collection::vec(any::<u8>(), 0..600),
            proptest::option::of(prop_oneof![
                any::<[u8; 20]>().prop_map(KeyId::Ski),
                any::<[u8; 32]>().prop_map(KeyId::ModulusDigest),
            ]),
            proptest::option::of("[a-z0-9.-]{1,60}"),
            proptest::option::of(any::<std::net::IpAddr>()),
            proptest::option::of(any::<std::net::IpAddr>()),
        )
            .prop_map(
                |(id, op, payload, key, server_name, client_ip, server_ip)| Message {
                    id,
                    op: Some(Op::from_code(op)),
                    payload,
                    key,
                    server_name,
                    client_ip,
                    server_ip,
                },
            )
    }

    proptest! {
        #[test]
        fn any_message_reads_back_as_written(m in arb_message(), pad in any::<bool>()) {
            let bytes = m.encode(pad).unwrap();
            let (header, body) = split(&bytes);
            prop_assert_eq!(usize::from(header.body_len), body.len());
            prop_assert_eq!(Message::decode(header, body).unwrap(), m);
        }

        /// Whatever arrives, decoding answers (a message or an error) and never panics;
        /// what it accepts encodes to bytes that decode to the same message.
        #[test]
        fn any_bytes_decode_or_are_refused(body in proptest::collection::vec(any::<u8>(), 0..300), id in any::<u32>()) {
            let header = Header { major: 1, minor: 0, body_len: body.len() as u16, id };
            if let Ok(m) = Message::decode(header, &body) {
                let again = m.encode(false).unwrap();
                let (h, b) = split(&again);
                prop_assert_eq!(Message::decode(h, b).unwrap(), m);
            }
        }

        /// A valid message with one byte changed anywhere still decodes or is refused.
        #[test]
        fn a_changed_byte_never_panics(m in arb_message(), at in any::<prop::sample::Index>(), to in any::<u8>()) {
            let mut bytes = m.encode(false).unwrap();
            let i = at.index(bytes.len() - HEADER_LEN) + HEADER_LEN;
            bytes[i] = to;
            let (header, body) = split(&bytes);
            let _ = Message::decode(header, body);
        }
    }
}
