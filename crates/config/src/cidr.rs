//! IP networks as the configuration writes them (`10.0.0.0/8`, `2001:db8::/32`, one
//! address): the trusted balancers of `proxy_protocol`, the `forwarded_from` clients,
//! `[signer] allow` and the networks of `access` rules, all read by [`network`] (a list
//! by [`networks`]), so that each refuses the same mistakes with the same words, at the
//! entry's own line:
//!
//! - what is not an address or `ADDR/PREFIX`, or a prefix longer than the address;
//! - a sign in the prefix (`/+8`: Rust's integer parse would take it);
//! - host bits past the prefix (`10.1.2.3/8`): whether the writer meant `10.0.0.0/8` or
//!   `10.1.2.3/32` is theirs to say (nginx warns and takes the network);
//! - an IPv4-mapped IPv6 network (`::ffff:10.0.0.0/104`), which would match no client:
//!   a client's mapped address is compared as IPv4 ([`Cidr::contains`]).

use std::net::IpAddr;
use std::ops::Range;
use std::sync::Arc;

use toml::Spanned;

use super::{ConfigError, Ctx};

/// An IP network, `ADDR/PREFIX` (or one address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

/// Why a network's text is not one, in words for the error and a hint.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct BadNetwork {
    problem: String,
    hint: String,
}

/// The hint for a network that does not parse.
const FORMS: &str =
    "a network is ADDR/PREFIX or one address: \"10.0.0.0/8\", \"192.0.2.7\" or \"2001:db8::/32\"";

impl Cidr {
    /// `"10.0.0.0/8"`, `"2001:db8::/32"`, or a single address; refused (with why) as the
    /// module's doc lists.
    pub(crate) fn parse(text: &str) -> Result<Cidr, BadNetwork> {
        let bad = |problem: String, hint: String| BadNetwork { problem, hint };
        let unparsed = || bad("is not ADDR/PREFIX".to_owned(), FORMS.to_owned());
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => {
                let addr = a.parse::<IpAddr>().map_err(|_| unparsed())?;
                let bits = p.trim_start_matches(['+', '-']);
                if bits.len() != p.len()
                    && !bits.is_empty()
                    && bits.bytes().all(|b| b.is_ascii_digit())
                {
                    return Err(bad(
                        "has a sign in its prefix: the prefix is a number of bits".to_owned(),
                        format!("write \"{a}/{bits}\""),
                    ));
                }
                if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(unparsed());
                }
                (addr, p.parse::<u32>().unwrap_or(u32::MAX))
            }
            None => {
                let a = text.parse::<IpAddr>().map_err(|_| unparsed())?;
                (a, if a.is_ipv4() { 32 } else { 128 })
            }
        };
        let width = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > width {
            return Err(bad(
                format!("has a prefix longer than its address's {width} bits"),
                FORMS.to_owned(),
            ));
        }
        let prefix = prefix as u8;
        if let IpAddr::V6(v6) = addr {
            if let Some(v4) = v6.to_ipv4_mapped() {
                let hint = if prefix >= 96 {
                    let net = Cidr {
                        net: IpAddr::V4(v4),
                        prefix: prefix - 96,
                    };
                    format!("write the IPv4 network: \"{}\"", net.network())
                } else {
                    "write the IPv4 network (e.g. \"10.0.0.0/8\")".to_owned()
                };
                return Err(bad(
                    "is an IPv4-mapped IPv6 network (::ffff:...), which matches no client: a client's IPv4-mapped address is compared as IPv4".to_owned(),
                    hint,
                ));
            }
        }
        let cidr = Cidr { net: addr, prefix };
        let network = cidr.network();
        if network.net != addr {
            return Err(bad(
                format!("has host bits set past its /{prefix} prefix"),
                format!("the network is \"{network}\" (one address is written without a prefix: \"{addr}\")"),
            ));
        }
        Ok(cidr)
    }

    /// The network its address is in: the address with its host bits cleared.
    fn network(self) -> Cidr {
        let width = if self.net.is_ipv4() { 32 } else { 128 };
        let keep = |bits: u128| match u32::from(self.prefix) {
            0 => 0,
            p => bits & (u128::MAX << (width - p)),
        };
        let net = match self.net {
            IpAddr::V4(v4) => IpAddr::from(std::net::Ipv4Addr::from(
                keep(u128::from(u32::from(v4))) as u32,
            )),
            IpAddr::V6(v6) => IpAddr::from(std::net::Ipv6Addr::from(keep(u128::from(v6)))),
        };
        Cidr { net, ..self }
    }

    /// Whether `ip` is in the network (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let bits = |a: IpAddr| -> u128 {
            match a {
                IpAddr::V4(v4) => u32::from(v4) as u128,
                IpAddr::V6(v6) => u128::from(v6),
            }
        };
        let width = if self.net.is_ipv4() { 32 } else { 128 };
        if ip.is_ipv4() != self.net.is_ipv4() {
            return false;
        }
        let shift = width - self.prefix as u32;
        shift >= width || (bits(ip) >> shift) == (bits(self.net) >> shift)
    }
}

/// As the configuration writes it: one address without a prefix.
impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.net, self.prefix) {
            (IpAddr::V4(_), 32) | (IpAddr::V6(_), 128) => write!(f, "{}", self.net),
            (net, prefix) => write!(f, "{net}/{prefix}"),
        }
    }
}

/// The network `text`, written at `at` in `key` (`"[signer] allow"`): an error at that
/// line names the entry and says what to write.
pub(crate) fn network(
    text: &str,
    at: Range<usize>,
    key: &str,
    ctx: &Ctx<'_>,
) -> Result<Cidr, ConfigError> {
    Cidr::parse(text).map_err(|bad| {
        ctx.err(
            Some(at),
            format!("{key} network {text:?} {}", bad.problem),
            Some(bad.hint),
        )
    })
}

/// A setting's networks, each entry spanned so that an error names its own line.
pub(crate) fn networks(
    list: &[Spanned<String>],
    key: &str,
    ctx: &Ctx<'_>,
) -> Result<Arc<[Cidr]>, ConfigError> {
    list.iter()
        .map(|entry| network(entry.get_ref(), entry.span(), key, ctx))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, Overrides};

    #[test]
    fn networks_contain_their_addresses() {
        let net = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(net.contains("10.200.3.4".parse().unwrap()));
        assert!(net.contains("::ffff:10.1.1.1".parse().unwrap()));
        assert!(!net.contains("11.0.0.1".parse().unwrap()));
        assert!(!net.contains("::1".parse().unwrap()));
        let one = Cidr::parse("127.0.0.1").unwrap();
        assert!(one.contains("127.0.0.1".parse().unwrap()));
        assert!(!one.contains("127.0.0.2".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
        assert!(Cidr::parse("2001:db8::/32")
            .unwrap()
            .contains("2001:db8:1::5".parse().unwrap()));
        assert!(Cidr::parse("::/0").is_ok());
        for bad in [
            "10.0.0.0/33",
            "nope",
            "10.0.0.0/x",
            "::/129",
            "10.0.0.0/",
            "10.0.0.0/ 8",
        ] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
    }

    /// Each setting that takes networks, with a bad entry on the list's third line (the
    /// list starts on line 2): `{}` is where the entry goes.
    const PLACES: [(&str, &str); 4] = [
        (
            "listen = [\"127.0.0.1:8443\", { address = \"127.0.0.1:8444\", proxy_protocol = true, trusted = [\n  \"10.0.0.0/8\",\n  \"{}\",\n] }]\n",
            "trusted network",
        ),
        (
            "listen = [\"127.0.0.1:8443\", { address = \"127.0.0.1:8444\", forwarded_from = [\n  \"10.0.0.0/8\",\n  \"{}\",\n] }]\n",
            "forwarded_from network",
        ),
        (
            "[signer]\nlisten = \"127.0.0.1:0\"\nca = \"ca.pem\"\ncertificate = { cert = \"s.pem\", key = \"s.key\" }\nallow = [\n  \"10.0.0.0/8\",\n  \"{}\",\n]\n[[signer.key]]\nfile = \"k.pem\"\n",
            "[signer] allow network",
        ),
        (
            "[[server]]\nnames = [\"x\"]\naccess = [\n  \"allow 10.0.0.0/8\",\n  \"deny {}\",\n]\n",
            "access rule",
        ),
    ];

    /// The line of the bad entry in each of [`PLACES`].
    fn line_of_entry(text: &str) -> usize {
        text.lines().position(|l| l.contains("BAD")).unwrap() + 1
    }

    /// Every place that takes networks refuses the same mistakes, at the bad entry's own
    /// line (not the list's, nor the listener's), naming it, why, and what to write.
    #[test]
    fn a_bad_network_is_refused_at_its_entrys_line_wherever_networks_are_written() {
        for (network, says, hint) in [
            (
                "10.0.0.0/33",
                "has a prefix longer than its address's 32 bits",
                "10.0.0.0/8",
            ),
            (
                "2001:db8::/129",
                "has a prefix longer than its address's 128 bits",
                "2001:db8::/32",
            ),
            ("10.0.0.0/300", "has a prefix longer", "10.0.0.0/8"),
            ("ten/8", "is not ADDR/PREFIX", "192.0.2.7"),
            (
                "10.0.0.0/+8",
                "has a sign in its prefix",
                "write \"10.0.0.0/8\"",
            ),
            (
                "10.0.0.0/-8",
                "has a sign in its prefix",
                "write \"10.0.0.0/8\"",
            ),
            (
                "10.1.2.3/8",
                "has host bits set past its /8 prefix",
                "the network is \"10.0.0.0/8\"",
            ),
            (
                "2001:db8::1/32",
                "has host bits set",
                "the network is \"2001:db8::/32\"",
            ),
            (
                "::ffff:10.0.0.0/104",
                "is an IPv4-mapped IPv6 network (::ffff:...), which matches no client",
                "write the IPv4 network: \"10.0.0.0/8\"",
            ),
            (
                "::FFFF:192.0.2.7",
                "is an IPv4-mapped",
                "write the IPv4 network: \"192.0.2.7\"",
            ),
        ] {
            for (template, key) in PLACES {
                let marked = template.replace("{}", "BAD");
                let text = template.replace("{}", network);
                let e = Config::parse(&text, "t.toml", &Overrides::default()).unwrap_err();
                let shown = e.to_string();
                let line = line_of_entry(&marked);
                assert!(
                    shown.starts_with(&format!("t.toml:{line}: ")),
                    "{network} in {key}: {shown}"
                );
                assert!(
                    e.message.contains(key) && e.message.contains(&format!("{network:?} {says}")),
                    "{network} in {key}: {shown}"
                );
                assert!(
                    e.hint.as_deref().is_some_and(|h| h.contains(hint)),
                    "{network} in {key}: {shown}"
                );
            }
        }
    }

    /// What is refused above has a right form, taken in each place.
    #[test]
    fn networks_in_their_right_forms_are_taken_everywhere() {
        for network in [
            "10.0.0.0/8",
            "192.0.2.7",
            "2001:db8::/32",
            "::1",
            "0.0.0.0/0",
            "10.1.2.3/32",
        ] {
            for (template, key) in PLACES {
                let text = template.replace("{}", network);
                Config::parse(&text, "t.toml", &Overrides::default())
                    .unwrap_or_else(|e| panic!("{network} in {key}: {e}"));
            }
        }
    }
}
