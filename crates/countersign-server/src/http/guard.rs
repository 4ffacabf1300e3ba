//! DNS-rebinding protection: requests whose `Host`, or `Origin` when present, is not an
//! allowed host get 403 before anything else runs. The MCP transport spec requires this
//! of local servers; countersign applies it to every route.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};

use super::AppState;

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

fn origin_authority(origin: &str) -> Option<&str> {
    let (_, rest) = origin.split_once("://")?;
    Some(rest.split('/').next().unwrap_or(rest))
}

pub async fn check_host_and_origin(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let policy = &state.hosts;
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    match host {
        Some(host) if policy.allows(host) => {}
        Some(host) => {
            return refuse(&format!(
                "host {host:?} is not allowed; add it to allowed_hosts in the config if this is a real hostname for this server"
            ));
        }
        None => return refuse("the request has no Host header"),
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let allowed = origin
            .to_str()
            .ok()
            .and_then(origin_authority)
            .is_some_and(|authority| policy.allows(authority));
        if !allowed {
            return refuse(&format!(
                "origin {origin:?} is not allowed (cross-site requests are refused)"
            ));
        }
    }
    next.run(req).await
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
    fn origin_authority_strips_scheme_and_path() {
        assert_eq!(
            origin_authority("http://localhost:8787"),
            Some("localhost:8787")
        );
        assert_eq!(origin_authority("null"), None);
    }
}
