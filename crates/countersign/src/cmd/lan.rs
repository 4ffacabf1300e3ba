//! `serve` listening beyond loopback: the addresses at which a phone (or another
//! machine) on the same network reaches it, printed at start and allowed as hosts.
//!
//! Allowing them is safe against what `allowed_hosts` guards: DNS rebinding needs a
//! host *name* that an attacker's DNS points at this machine, and these are IP
//! literals of this machine's own interfaces. They are added only when `serve` listens
//! on them; a listener on loopback adds nothing.

use std::net::{IpAddr, SocketAddr};

/// What `serve` tells the operator and allows, for a listener bound to `bound`.
#[derive(Debug, Default)]
pub struct Reach {
    /// `http://ADDRESS:PORT/` for each address.
    pub urls: Vec<String>,
    /// The addresses, as `allowed_hosts` entries.
    pub hosts: Vec<String>,
}

/// The addresses of this machine a client on its networks can use for `bound`: the
/// address itself, or for an unspecified one (`0.0.0.0`: every IPv4 address; `::`:
/// every address) those of the interfaces, without loopback and link-local ones (a
/// link-local IPv6 address needs a zone a browser cannot take).
pub fn reach(bound: SocketAddr) -> Reach {
    let ip = bound.ip();
    if ip.is_loopback() {
        return Reach::default();
    }
    let addresses: Vec<IpAddr> = if ip.is_unspecified() {
        match if_addrs::get_if_addrs() {
            Ok(interfaces) => interfaces
                .into_iter()
                .filter(|i| !i.is_loopback() && !i.is_link_local())
                .map(|i| i.ip())
                .filter(|a| ip.is_ipv6() || a.is_ipv4())
                .collect(),
            Err(err) => {
                tracing::warn!(%err, "could not list this machine's network addresses");
                Vec::new()
            }
        }
    } else {
        vec![ip]
    };
    let mut reach = Reach::default();
    for address in addresses {
        let authority = match address {
            IpAddr::V4(v4) => format!("{v4}:{}", bound.port()),
            IpAddr::V6(v6) => format!("[{v6}]:{}", bound.port()),
        };
        let host = address.to_string();
        if !reach.hosts.contains(&host) {
            reach.urls.push(format!("http://{authority}/"));
            reach.hosts.push(host);
        }
    }
    reach
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_reaches_no_one_else() {
        let r = reach("127.0.0.1:8787".parse().unwrap());
        assert!(r.urls.is_empty() && r.hosts.is_empty());
        assert!(reach("[::1]:8787".parse().unwrap()).urls.is_empty());
    }

    #[test]
    fn a_specific_address_is_its_own_reach() {
        let r = reach("192.0.2.7:9000".parse().unwrap());
        assert_eq!(r.urls, ["http://192.0.2.7:9000/"]);
        assert_eq!(r.hosts, ["192.0.2.7"]);
        let r = reach("[fd00::7]:9000".parse().unwrap());
        assert_eq!(r.urls, ["http://[fd00::7]:9000/"]);
        assert_eq!(r.hosts, ["fd00::7"]);
    }

    #[test]
    fn every_interface_for_an_unspecified_address() {
        let r = reach("0.0.0.0:8787".parse().unwrap());
        for (url, host) in r.urls.iter().zip(&r.hosts) {
            let ip: IpAddr = host.parse().unwrap();
            assert!(ip.is_ipv4() && !ip.is_loopback(), "{host}");
            assert_eq!(url, &format!("http://{host}:8787/"));
        }
    }
}
