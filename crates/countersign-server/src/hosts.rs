//! Host names: which ones only this machine can reach. The Host guard, the SMTP URL
//! (plain SMTP only to a local relay), Slack's API URL (http only for a local
//! stand-in) and the binary's warnings all ask the same question here.

/// The names of this machine that only it can use.
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Whether `host` is a loopback name or address (`localhost`, `127.0.0.1`, `[::1]`...).
pub fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether `hosts` allows only loopback names: remote clients would get 403.
pub fn only_loopback(hosts: &[String]) -> bool {
    hosts.iter().all(|h| is_loopback(h))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_and_addresses() {
        for host in [
            "localhost",
            "LOCALHOST",
            "127.0.0.1",
            "127.8.9.1",
            "::1",
            "[::1]",
        ] {
            assert!(is_loopback(host), "{host}");
        }
        for host in [
            "example.com",
            "10.0.0.1",
            "0.0.0.0",
            "localhost.example.com",
            "",
        ] {
            assert!(!is_loopback(host), "{host}");
        }
        assert!(only_loopback(&["localhost".into(), "::1".into()]));
        assert!(!only_loopback(&[
            "localhost".into(),
            "gate.example.com".into()
        ]));
    }
}
