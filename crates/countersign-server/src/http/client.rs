//! Who a client is, by address: the socket's peer, or, when that peer is one of the
//! configured trusted proxies (`trusted_proxies`), the address the proxies forwarded in
//! `X-Forwarded-For`. The header is read right to left, each proxy having appended the
//! address it saw, and the first address that is not a trusted proxy is the client's: what
//! a client writes into the header itself is to the left of that and never believed.
//! Per-address limits (the sign-in throttle) count IPv6 clients by /64, the block one
//! host usually holds.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use axum::extract::{ConnectInfo, FromRequestParts};
use http::HeaderMap;

use super::AppState;

/// An address block: `10.0.0.0/8`, `fd00::/8`, or one address (`192.0.2.1`, `::1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                mask(u128::from(u32::from(ip)), self.prefix, 32)
                    == mask(u128::from(u32::from(net)), self.prefix, 32)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                mask(u128::from(ip), self.prefix, 128) == mask(u128::from(net), self.prefix, 128)
            }
            _ => false,
        }
    }
}

/// The top `prefix` bits of a `width`-bit address.
fn mask(bits: u128, prefix: u8, width: u8) -> u128 {
    let keep = u32::from(prefix.min(width));
    if keep == 0 {
        return 0;
    }
    let drop = u32::from(width) - keep;
    (bits >> drop) << drop
}

impl FromStr for IpNet {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let bad = || {
            format!(
                "trusted_proxies entry {text:?} is not an IP address or block (such as 10.0.0.1, 10.0.0.0/8 or fd00::/8)"
            )
        };
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let addr = canonical(addr.parse::<IpAddr>().map_err(|_| bad())?);
        let width = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= width)
                .ok_or_else(bad)?,
            None => width,
        };
        Ok(IpNet { addr, prefix })
    }
}

/// The reverse proxies in front of this server whose `X-Forwarded-For` is believed.
/// Empty by default: the socket's peer is the client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// Parses `trusted_proxies`; the error names the entry that is not an address.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        entries
            .iter()
            .map(|e| e.parse())
            .collect::<Result<Vec<_>, _>>()
            .map(TrustedProxies)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|net| net.contains(ip))
    }

    /// The client's address for a request that came from `peer` with `headers`.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut client = canonical(peer);
        if !self.trusts(client) {
            return client;
        }
        let hops: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        for hop in hops.iter().rev() {
            // What a trusted proxy wrote but is no address: the proxy is the client.
            let Some(ip) = parse_hop(hop) else {
                return client;
            };
            client = canonical(ip);
            if !self.trusts(client) {
                return client;
            }
        }
        client
    }
}

/// One `X-Forwarded-For` element: `192.0.2.1`, `192.0.2.1:4711`, `2001:db8::1` or
/// `[2001:db8::1]:4711`.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip);
    }
    hop.parse::<SocketAddr>().ok().map(|s| s.ip())
}

/// IPv4-mapped IPv6 addresses (`::ffff:192.0.2.1`) as the IPv4 address they are.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// What per-address limits count a client as: its IPv4 address, or its IPv6 /64.
pub fn limit_key(ip: IpAddr) -> IpAddr {
    match canonical(ip) {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(mask(u128::from(v6), 64, 128))),
        v4 => v4,
    }
}

/// The client's address (see the module's comment), when the server was started with
/// connection info.
pub struct ClientAddr(pub Option<IpAddr>);

impl FromRequestParts<AppState> for ClientAddr {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        state: &AppState,
    ) -> Result<Self, Infallible> {
        Ok(ClientAddr(
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|ConnectInfo(addr)| state.proxies.client(addr.ip(), &parts.headers)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn forwarded(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append("x-forwarded-for", v.parse().unwrap());
        }
        headers
    }

    #[test]
    fn without_trusted_proxies_the_peer_is_the_client() {
        let none = TrustedProxies::default();
        let headers = forwarded(&["203.0.113.9"]);
        assert_eq!(none.client(ip("10.0.0.2"), &headers), ip("10.0.0.2"));
    }

    #[test]
    fn forwarded_for_is_read_right_to_left_past_trusted_proxies() {
        let proxies =
            TrustedProxies::parse(&["10.0.0.0/8".into(), "::1".into(), "192.0.2.7".into()])
                .unwrap();
        // The client wrote a fake address first; the proxies appended the real one.
        let headers = forwarded(&["198.51.100.1, 203.0.113.9", "10.1.2.3"]);
        assert_eq!(proxies.client(ip("10.0.0.2"), &headers), ip("203.0.113.9"));
        // A peer that is no trusted proxy is believed over any header.
        assert_eq!(
            proxies.client(ip("198.51.100.50"), &headers),
            ip("198.51.100.50")
        );
        // Ports and brackets, and IPv4 in IPv6.
        let headers = forwarded(&["[2001:db8::5]:4711"]);
        assert_eq!(proxies.client(ip("::1"), &headers), ip("2001:db8::5"));
        let headers = forwarded(&["203.0.113.9:80"]);
        assert_eq!(
            proxies.client(ip("::ffff:192.0.2.7"), &headers),
            ip("203.0.113.9")
        );
        // Nothing forwarded, or garbage: the proxy itself.
        assert_eq!(
            proxies.client(ip("10.0.0.2"), &HeaderMap::new()),
            ip("10.0.0.2")
        );
        let headers = forwarded(&["unknown"]);
        assert_eq!(proxies.client(ip("10.0.0.2"), &headers), ip("10.0.0.2"));
    }

    #[test]
    fn bad_entries_are_named() {
        for bad in ["10.0.0.0/33", "proxy.local", "::1/129", ""] {
            let err = TrustedProxies::parse(&[bad.into()]).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
        assert!(TrustedProxies::parse(&["0.0.0.0/0".into()]).is_ok());
    }

    #[test]
    fn ipv6_clients_are_counted_by_64() {
        assert_eq!(
            limit_key(ip("2001:db8:1:2:aaaa::1")),
            limit_key(ip("2001:db8:1:2:ffff::9"))
        );
        assert_ne!(
            limit_key(ip("2001:db8:1:2::1")),
            limit_key(ip("2001:db8:1:3::1"))
        );
        assert_eq!(limit_key(ip("192.0.2.1")), ip("192.0.2.1"));
        assert_eq!(limit_key(ip("::ffff:192.0.2.1")), ip("192.0.2.1"));
    }
}
