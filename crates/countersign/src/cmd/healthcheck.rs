//! `countersign healthcheck`: asks a running `serve` for `/healthz`, for a container's
//! `HEALTHCHECK` (no curl in the image) or a script. Exit 0 when it answers
//! `{"status":"ok"}`, 1 when it answers otherwise or not at all.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::config::Config;

#[derive(Debug, Args)]
pub struct HealthcheckArgs {
    /// The server's base URL. Default: the configured listen address (a wildcard
    /// address is asked on loopback).
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// How long to wait for the answer.
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    pub timeout: u64,
}

pub async fn run(config: &Config, args: &HealthcheckArgs) -> anyhow::Result<ExitCode> {
    let base = match &args.url {
        Some(url) => url.trim_end_matches('/').to_string(),
        None => format!("http://{}", loopback_for(config.listen)),
    };
    let url = format!("{base}/healthz");
    match ask(&base, Duration::from_secs(args.timeout.max(1))).await {
        Ok((status, body)) if status.is_success() && body["status"] == "ok" => {
            println!("ok: {url}");
            Ok(ExitCode::SUCCESS)
        }
        Ok((status, body)) => {
            println!("unhealthy: {url} answered {status} {body}");
            Ok(ExitCode::from(1))
        }
        Err(err) => {
            println!("unhealthy: {url}: {err}");
            Ok(ExitCode::from(1))
        }
    }
}

/// `GET {base}/healthz`: the status and the JSON answer (`null` if it is not JSON).
pub(crate) async fn ask(
    base: &str,
    timeout: Duration,
) -> Result<(reqwest::StatusCode, serde_json::Value), reqwest::Error> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(timeout)
        .build()?;
    let answer = client.get(format!("{base}/healthz")).send().await?;
    let status = answer.status();
    Ok((status, answer.json().await.unwrap_or_default()))
}

/// Where to reach a server listening on `listen` from the same machine.
pub(crate) fn loopback_for(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), listen.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), listen.port())
        }
        _ => listen,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_listen_address_is_asked_on_loopback() {
        let at = |s: &str| loopback_for(s.parse().unwrap()).to_string();
        assert_eq!(at("0.0.0.0:8787"), "127.0.0.1:8787");
        assert_eq!(at("[::]:8787"), "[::1]:8787");
        assert_eq!(at("10.0.0.5:9000"), "10.0.0.5:9000");
    }
}
