//! Which addresses are public: the proxy never connects to any other unless it was listed
//! explicitly (an allow entry naming the address, or `egress.resolve`), so a name that
//! resolves to the daemon's loopback, the host's network or a cloud's metadata service
//! (169.254.169.254) reaches none of them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The addresses of this host's own interfaces (a public one included: services the host
/// listens on for all addresses are the host's, not the internet's).
pub(super) fn local_addresses() -> Vec<IpAddr> {
    let Ok(interfaces) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    interfaces
        .filter_map(|interface| interface.address)
        .filter_map(|address| {
            address
                .as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| address.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        })
        .map(|ip| ip.to_canonical())
        .collect()
}

/// Whether `ip` is a public unicast address.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => public_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => public_v4(v4),
            None => public_v6(v6),
        },
    }
}

fn public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        // Shared address space (carrier-grade NAT), 100.64.0.0/10.
        || (a == 100 && (64..128).contains(&b))
        // IETF protocol assignments, 192.0.0.0/24; benchmarking, 198.18.0.0/15.
        || (a == 192 && b == 0 && c == 0)
        || (a == 198 && (b == 18 || b == 19))
        // Reserved, 240.0.0.0/4.
        || a >= 240)
}

fn public_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        // Unique local, fc00::/7; link-local, fe80::/10; site-local (old), fec0::/10.
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80
        || (first & 0xffc0) == 0xfec0
        // Documentation, 2001:db8::/32.
        || (first == 0x2001 && ip.segments()[1] == 0x0db8)
        // IPv4-compatible and NAT64 (64:ff9b::/96) forms of any IPv4 address: judged as
        // that address would be, conservatively refused.
        || ip.segments()[..6] == [0, 0, 0, 0, 0, 0]
        || (first == 0x64 && ip.segments()[1] == 0xff9b)
        // 6to4 (2002::/16) and Teredo (2001::/32) carry an IPv4 address inside.
        || first == 0x2002
        || (first == 0x2001 && ip.segments()[1] == 0))
}
