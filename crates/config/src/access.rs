//! `access`: who may send requests to a server or to one of its routes, as nginx's
//! `allow` and `deny`. The rules are tried in order and the first whose network holds
//! the client's address decides; an address no rule matches is allowed (nginx's default),
//! so a list that means "only these" ends with `"deny all"`. A route's list, when it has
//! one, replaces its server's (as an nginx `location`'s rules replace its `server`'s).

use std::net::IpAddr;

use toml::Spanned;

use super::cidr::{self, Cidr};
use super::{ConfigError, Ctx};

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
}

/// The first `access` rules written, a server's or a route's (for the check of settings
/// judged on the client's address against HTTP/3 behind a balancer).
pub(crate) fn first_rules(
    raw: &crate::schema::ConfigFile,
) -> Option<&Spanned<Vec<Spanned<String>>>> {
    raw.server.iter().find_map(|s| {
        s.access
            .as_ref()
            .or_else(|| s.route.iter().find_map(|r| r.access.as_ref()))
    })
}

/// `access = ["allow 10.0.0.0/8", "deny all"]` as written: an empty list refused at its
/// line, a bad rule at its own.
pub(crate) fn resolve_access(
    rules: Option<&Spanned<Vec<Spanned<String>>>>,
    ctx: &Ctx<'_>,
) -> Result<Option<Access>, ConfigError> {
    let Some(rules) = rules else {
        return Ok(None);
    };
    if rules.get_ref().is_empty() {
        return Err(ctx.err(
            Some(rules.span()),
            "access = [] has no rule",
            Some("leave access out for everyone, or write [\"allow all\"]".to_owned()),
        ));
    }
    let parsed = rules
        .get_ref()
        .iter()
        .map(|entry| {
            let text = entry.get_ref();
            let Some((allow, network)) = shape(text) else {
                return Err(ctx.err(
                    Some(entry.span()),
                    format!("access rule {text:?} is not \"allow NETWORK\" or \"deny NETWORK\""),
                    Some(
                        "a NETWORK is an address, ADDR/PREFIX (\"10.0.0.0/8\") or \"all\": access = [\"allow 10.0.0.0/8\", \"deny all\"]"
                            .to_owned(),
                    ),
                ));
            };
            let network = network
                .map(|net| cidr::network(net, entry.span(), &format!("access rule {text:?}:"), ctx))
                .transpose()?;
            Ok(Rule { allow, network })
        })
        .collect::<Result<Vec<Rule>, ConfigError>>()?;
    Ok(Some(Access(parsed)))
}

/// A rule's words: allow (true) or deny, and its network's text (None: `all`).
fn shape(text: &str) -> Option<(bool, Option<&str>)> {
    let mut words = text.split_whitespace();
    let allow = match words.next()? {
        "allow" => true,
        "deny" => false,
        _ => return None,
    };
    let network = match words.next()? {
        "all" => None,
        net => Some(net),
    };
    words.next().is_none().then_some((allow, network))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, Overrides};

    fn access(rules: &[&str]) -> Access {
        let rule = |text: &str| {
            let (allow, network) = shape(text).expect("a rule");
            let network = network.map(|net| Cidr::parse(net).expect("a network"));
            Rule { allow, network }
        };
        Access(rules.iter().map(|r| rule(r)).collect())
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
    fn an_empty_list_and_rules_on_http3_behind_a_balancer_are_refused() {
        let parse = |text: &str| Config::parse(text, "t.toml", &Overrides::default());
        let e = parse("[[server]]\nnames = [\"x\"]\naccess = []\n").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        let balanced = "listen = [{ address = \"127.0.0.1:8443\", http3 = true, proxy_protocol = true, trusted = [\"10.0.0.0/8\"] }]\n[[server]]\nnames = [\"x\"]\n";
        parse(balanced).expect("no rules: fine");
        let e = parse(&format!("{balanced}access = [\"deny all\"]\n")).unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.to_string().contains("balancer"), "{e}");
    }

    /// A bad rule is refused at its own line, naming it: one that is not `allow` or
    /// `deny` and one network, and one whose network is refused (cidr's tests have
    /// every such network).
    #[test]
    fn a_rule_that_is_not_allow_or_deny_a_network_is_refused_at_its_line() {
        for (bad, says) in [
            ("permit all", "is not \"allow NETWORK\""),
            ("allow", "is not \"allow NETWORK\""),
            ("allow 10.0.0.1 extra", "is not \"allow NETWORK\""),
            ("deny 10.0.0.0/33", "has a prefix longer"),
            ("deny everyone", "is not ADDR/PREFIX"),
            ("deny ::ffff:192.0.2.0/120", "IPv4-mapped"),
        ] {
            let text = format!(
                "[[server]]\nnames = [\"x\"]\n\naccess = [\"allow 127.0.0.1\",\n  \"{bad}\"]\n"
            );
            let e = Config::parse(&text, "t.toml", &Overrides::default()).unwrap_err();
            assert_eq!(e.line, Some(5), "{bad}: {e}");
            assert!(e.message.contains(&format!("access rule {bad:?}")), "{e}");
            assert!(e.message.contains(says), "{bad}: {e}");
        }
    }
}
