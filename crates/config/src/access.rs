//! `access`: who may send requests to a server or to one of its routes, as nginx's
//! `allow` and `deny`. The rules are tried in order and the first whose network holds
//! the client's address decides; an address no rule matches is allowed (nginx's default),
//! so a list that means "only these" ends with `"deny all"`. A route's list, when it has
//! one, replaces its server's (as an nginx `location`'s rules replace its `server`'s).

use std::net::IpAddr;
use std::ops::Range;

use toml::Spanned;

use super::{Cidr, ConfigError, Ctx};

/// An ordered list of allow and deny rules; empty: everyone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access(Vec<Rule>);

/// One rule: allow or deny a network, or everyone (`None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rule {
    allow: bool,
    network: Option<Cidr>,
}

impl Access {
    /// Whether a request from `client` may go on.
    pub fn allows(&self, client: IpAddr) -> bool {
        self.0
            .iter()
            .find(|rule| rule.network.is_none_or(|net| net.contains(client)))
            .is_none_or(|rule| rule.allow)
    }

    /// Whether there are no rules (everyone is allowed).
    pub fn is_open(&self) -> bool {
        self.0.is_empty()
    }
}

/// `access = ["allow 10.0.0.0/8", "deny all"]` as written, its line for errors.
pub(crate) fn resolve_access(
    rules: Option<&Spanned<Vec<String>>>,
    ctx: &Ctx<'_>,
) -> Result<Option<Access>, ConfigError> {
    let Some(rules) = rules else {
        return Ok(None);
    };
    let span: Range<usize> = rules.span();
    let parsed = rules
        .get_ref()
        .iter()
        .map(|text| {
            rule(text).ok_or_else(|| {
                ctx.err(
                    Some(span.clone()),
                    format!("access rule {text:?} is not \"allow NETWORK\" or \"deny NETWORK\""),
                    Some(
                        "a NETWORK is an address, ADDR/PREFIX (\"10.0.0.0/8\") or \"all\": access = [\"allow 10.0.0.0/8\", \"deny all\"]"
                            .to_owned(),
                    ),
                )
            })
        })
        .collect::<Result<Vec<Rule>, ConfigError>>()?;
    Ok(Some(Access(parsed)))
}

fn rule(text: &str) -> Option<Rule> {
    let mut words = text.split_whitespace();
    let allow = match words.next()? {
        "allow" => true,
        "deny" => false,
        _ => return None,
    };
    let network = match words.next()? {
        "all" => None,
        net => Some(Cidr::parse(net)?),
    };
    words.next().is_none().then_some(Rule { allow, network })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, Overrides};

    fn access(rules: &[&str]) -> Access {
        Access(rules.iter().map(|r| rule(r).expect("a rule")).collect())
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn the_first_matching_rule_decides_and_no_match_allows() {
        let only_ten = access(&["allow 10.0.0.0/8", "deny all"]);
        assert!(only_ten.allows(ip("10.1.2.3")));
        assert!(only_ten.allows(ip("::ffff:10.1.2.3")));
        assert!(!only_ten.allows(ip("192.0.2.1")));
        assert!(!only_ten.allows(ip("2001:db8::1")));
        let one_out = access(&["deny 192.0.2.7", "allow 192.0.2.0/24"]);
        assert!(!one_out.allows(ip("192.0.2.7")));
        assert!(one_out.allows(ip("192.0.2.8")));
        // No rule matches: allowed, as nginx does.
        assert!(one_out.allows(ip("198.51.100.1")));
        assert!(Access::default().allows(ip("203.0.113.9")));
    }

    #[test]
    fn a_rule_that_is_not_allow_or_deny_a_network_is_refused_at_its_line() {
        for bad in [
            "permit all",
            "allow",
            "deny 10.0.0.0/33",
            "allow 10.0.0.1 extra",
            "deny everyone",
        ] {
            let text = format!(
                "[[server]]\nnames = [\"x\"]\n\naccess = [\"allow 127.0.0.1\", \"{bad}\"]\n"
            );
            let e = Config::parse(&text, "t.toml", &Overrides::default()).unwrap_err();
            assert_eq!(e.line, Some(4), "{bad}: {e}");
            assert!(e.to_string().contains(bad), "{e}");
        }
    }
}
