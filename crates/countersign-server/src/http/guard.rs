//! DNS-rebinding protection: requests whose `Host`, or `Origin` when present, is not an
//! allowed host (an `Origin` also on an allowed port) get 403 before anything else runs. The MCP transport spec requires this
//! of local servers; countersign applies it to every route.

use std::sync::Arc;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};

use super::check::Check;

/// Allowed hosts: `name` allows that host on any port, `name:port` only that port, and
/// `*` allows any host (for deployments that check Host in front of countersign).
#[derive(Debug, Clone)]
pub struct HostPolicy {
    entries: Vec<(String, Option<u16>)>,
    any: bool,
}

impl HostPolicy {
    pub fn new(allowed: &[String]) -> Self {
        let mut entries = Vec::new();
        let mut any = false;
        for entry in allowed {
            let entry = entry.trim().to_ascii_lowercase();
            if entry == "*" {
                any = true;
                continue;
            }
            entries.push(split_authority(&entry));
        }
        Self { entries, any }
    }

    pub fn allows(&self, authority: &str) -> bool {
        if self.any {
            return true;
        }
        let (host, port) = split_authority(&authority.to_ascii_lowercase());
        self.entries
            .iter()
            .any(|(h, p)| *h == host && (p.is_none() || *p == port))
    }
}

impl HostPolicy {
    /// Whether a request to `host` (its Host header) may come from the page at
    /// `origin` (`scheme://host[:port]`). The origin's host must be allowed, and its
    /// port too: a `name:port` entry names it; a bare `name` allows it only on the port
    /// the request was sent to (this server's, as the client reached it), never on any
    /// port, since another port of the same host is another site (any local program
    /// can serve a page there). A missing port is the scheme's default.
    pub fn allows_origin(&self, origin: &str, host: &str) -> bool {
        if self.any {
            return true;
        }
        let Some((scheme, authority)) = origin.split_once("://") else {
            return false;
        };
        let authority = authority.split('/').next().unwrap_or(authority);
        let default_port = match scheme.to_ascii_lowercase().as_str() {
            "http" => 80,
            "https" => 443,
            _ => return false,
        };
        let (origin_host, origin_port) = split_authority(&authority.to_ascii_lowercase());
        let origin_port = origin_port.unwrap_or(default_port);
        let (_, host_port) = split_authority(&host.to_ascii_lowercase());
        let host_port = host_port.unwrap_or(default_port);
        self.entries.iter().any(|(h, p)| {
            *h == origin_host
                && match p {
                    Some(p) => *p == origin_port,
                    None => origin_port == host_port,
                }
        })
    }
}

/// Splits `host[:port]`, `[v6]:port` or a bare IPv6 address.
fn split_authority(authority: &str) -> (String, Option<u16>) {
    if let Some(rest) = authority.strip_prefix('[')
        && let Some((host, after)) = rest.split_once(']')
    {
        let port = after.strip_prefix(':').and_then(|p| p.parse().ok());
        return (host.to_string(), port);
    }
    if authority.matches(':').count() > 1 {
        return (authority.to_string(), None);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => match port.parse() {
            Ok(port) => (host.to_string(), Some(port)),
            Err(_) => (authority.to_string(), None),
        },
        None => (authority.to_string(), None),
    }
}

/// Refuses (403 `forbidden_host`) a request whose Host, or Origin when it has one, is
/// not allowed; layered over every route (`http/check.rs`).
#[derive(Clone)]
pub struct HostAndOrigin(pub Arc<HostPolicy>);

impl Check for HostAndOrigin {
    fn refusal(&self, req: &mut Request) -> Option<Response> {
        let policy = &self.0;
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| req.uri().authority().map(|a| a.as_str()));
        let host = match host {
            Some(host) if policy.allows(host) => host,
            Some(host) => {
                return Some(refuse(&format!(
                    "host {host:?} is not allowed; add it to allowed_hosts in the config if this is a real hostname for this server"
                )));
            }
            None => return Some(refuse("the request has no Host header")),
        };
        if let Some(origin) = req.headers().get(header::ORIGIN) {
            let allowed = origin
                .to_str()
                .ok()
                .is_some_and(|origin| policy.allows_origin(origin, host));
            if !allowed {
                return Some(refuse(&format!(
                    "origin {origin:?} is not allowed (cross-site requests are refused)"
                )));
            }
        }
        None
    }
}

fn refuse(message: &str) -> Response {
    (
        StatusCode::FORBIDDEN,
        axum::Json(serde_json::json!({"error": {"code": "forbidden_host", "message": message}})),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_policy_matches_hosts_and_ports() {
        let policy = HostPolicy::new(&[
            "localhost".into(),
            "127.0.0.1".into(),
            "::1".into(),
            "approvals.example.com:443".into(),
        ]);
        assert!(policy.allows("localhost:8787"));
        assert!(policy.allows("LOCALHOST"));
        assert!(policy.allows("127.0.0.1:1"));
        assert!(policy.allows("[::1]:8787"));
        assert!(policy.allows("approvals.example.com:443"));
        assert!(!policy.allows("approvals.example.com:8443"));
        assert!(!policy.allows("evil.example"));
        assert!(!policy.allows("localhost.evil.example:8787"));
        assert!(HostPolicy::new(&["*".into()]).allows("anything:1"));
    }

    #[test]
    fn an_origin_on_a_host_listed_without_a_port_passes_only_on_the_servers_port() {
        let policy = HostPolicy::new(&[
            "localhost".into(),
            "127.0.0.1".into(),
            "approvals.example.com:443".into(),
            "gate.example.com".into(),
        ]);
        let host = "127.0.0.1:8787";
        assert!(policy.allows_origin("http://localhost:8787", host));
        assert!(policy.allows_origin("http://127.0.0.1:8787/path", host));
        assert!(!policy.allows_origin("http://localhost:9999", host));
        assert!(!policy.allows_origin("http://localhost", host));
        assert!(!policy.allows_origin("null", host));
        assert!(!policy.allows_origin("file://localhost:8787", host));
        // An explicit port, and the scheme's default port.
        assert!(policy.allows_origin("https://approvals.example.com", "anything"));
        assert!(!policy.allows_origin("https://approvals.example.com:8443", "x:8443"));
        assert!(policy.allows_origin("https://gate.example.com", "gate.example.com"));
        assert!(policy.allows_origin("https://gate.example.com", "gate.example.com:443"));
        assert!(!policy.allows_origin("http://gate.example.com:8080", "gate.example.com"));
        assert!(HostPolicy::new(&["*".into()]).allows_origin("http://evil:1", host));
    }
}
