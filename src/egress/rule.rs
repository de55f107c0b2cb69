//! One allow or deny entry: `host`, `*.host`, `*`, each with an optional `:port`; an IPv6
//! address in brackets (`[2001:db8::1]:443`).

use std::net::IpAddr;

/// A parsed entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    text: String,
    host: Host,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    Any,
    /// This name (lower case) or address.
    Exact(String),
    /// Any name ending in `.suffix` (not `suffix` itself).
    Below(String),
}

impl Rule {
    pub fn parse(text: &str) -> Result<Rule, String> {
        let lower = text.trim().to_ascii_lowercase();
        let (host, port) = split_port(&lower)?;
        let host = match host {
            "" => return Err("no host".to_owned()),
            "*" => Host::Any,
            _ if host.starts_with("*.") => {
                let suffix = &host[2..];
                check_name(suffix)?;
                Host::Below(suffix.to_owned())
            }
            _ if host.parse::<IpAddr>().is_ok() => Host::Exact(host.to_owned()),
            _ => {
                check_name(host)?;
                Host::Exact(host.to_owned())
            }
        };
        Ok(Rule {
            text: text.trim().to_owned(),
            host,
            port,
        })
    }

    /// The entry as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether `host` (lower case, no brackets) at `port` matches.
    pub fn matches(&self, host: &str, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match &self.host {
            Host::Any => true,
            Host::Exact(name) => name == host || same_address(name, host),
            Host::Below(suffix) => host
                .strip_suffix(suffix.as_str())
                .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.')),
        }
    }

    /// Whether the entry names `ip` itself (listing an address explicitly).
    pub fn names_address(&self, ip: IpAddr) -> bool {
        matches!(&self.host, Host::Exact(name)
            if name.parse::<IpAddr>().is_ok_and(|named| named.to_canonical() == ip.to_canonical()))
    }
}

/// Two spellings of one address (`::1` and `0:0::1`, `::ffff:1.2.3.4` and `1.2.3.4`).
fn same_address(a: &str, b: &str) -> bool {
    match (a.parse::<IpAddr>(), b.parse::<IpAddr>()) {
        (Ok(a), Ok(b)) => a.to_canonical() == b.to_canonical(),
        _ => false,
    }
}

/// `host[:port]`, `[v6][:port]`, or a bare IPv6 address.
fn split_port(text: &str) -> Result<(&str, Option<u16>), String> {
    let port = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{p:?} is not a port"))
    };
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("an unclosed [")?;
        return match after {
            "" => Ok((host, None)),
            _ => Ok((
                host,
                Some(port(after.strip_prefix(':').ok_or("text after ]")?)?),
            )),
        };
    }
    if text.matches(':').count() > 1 {
        return Ok((text, None));
    }
    match text.split_once(':') {
        Some((host, p)) => Ok((host, Some(port(p)?))),
        None => Ok((text, None)),
    }
}

/// A host name: labels of letters, digits, `-` and `_`, dot-separated.
fn check_name(name: &str) -> Result<(), String> {
    let fine = name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if fine {
        Ok(())
    } else {
        Err("not a host name (host, *.host, *, with an optional :port)".to_owned())
    }
}
