//! `[[gateway]]`: the MCP gateways `serve` runs at `/mcp/gateway/<name>` (and
//! `countersign proxy --gateway <name>` serves over stdio), each in front of upstream MCP
//! servers started as child processes or reached over Streamable HTTP. docs/gateway.md.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::bail;
use countersign_server::held::MAX_HOLD_SECONDS;
use countersign_server::mcp::gateway::{
    DEFAULT_FORWARD_SECONDS, DEFAULT_HOLD_SECONDS, GatewayConfig, PREFIX_SEPARATOR, Transport,
    UpstreamConfig,
};
use serde::Deserialize;

/// The longest an approved call may take upstream.
const MAX_FORWARD_SECONDS: u64 = 24 * 3600;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewaySection {
    pub name: String,
    pub hold_seconds: Option<u64>,
    pub forward_timeout_seconds: Option<u64>,
    #[serde(default)]
    pub upstream: Vec<UpstreamSection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSection {
    pub name: String,
    /// Believe its tools' `readOnlyHint` (default: no).
    pub trusted: Option<bool>,
    /// A child process: the program and its arguments.
    pub command: Option<Vec<String>>,
    pub cwd: Option<PathBuf>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Streamable HTTP.
    pub url: Option<String>,
    pub bearer_token: Option<String>,
    pub bearer_token_file: Option<PathBuf>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Allows a plain `http://` URL to a host other than this machine.
    pub allow_plain_http: Option<bool>,
}

/// The gateways, checked. Relative paths (`cwd`, `bearer_token_file`) are from the
/// config file's directory.
pub fn resolve(
    sections: Vec<GatewaySection>,
    config_file: Option<&Path>,
) -> anyhow::Result<Vec<GatewayConfig>> {
    let base = super::base_dir(config_file);
    let mut out: Vec<GatewayConfig> = Vec::new();
    for section in sections {
        let what = format!("[[gateway]] {:?}", section.name);
        super::plain_name(&what, &section.name)?;
        if out.iter().any(|g| g.name == section.name) {
            bail!("{what} is configured twice");
        }
        let hold = section.hold_seconds.unwrap_or(DEFAULT_HOLD_SECONDS);
        if hold == 0 || hold > MAX_HOLD_SECONDS {
            bail!("{what}: hold_seconds: give between 1 and {MAX_HOLD_SECONDS}");
        }
        let forward = section
            .forward_timeout_seconds
            .unwrap_or(DEFAULT_FORWARD_SECONDS);
        if forward == 0 || forward > MAX_FORWARD_SECONDS {
            bail!("{what}: forward_timeout_seconds: give between 1 and {MAX_FORWARD_SECONDS}");
        }
        if section.upstream.is_empty() {
            bail!(
                "{what} has no upstream: add a [[gateway.upstream]] with a name and a command or a url"
            );
        }
        let several = section.upstream.len() > 1;
        let mut upstreams: Vec<UpstreamConfig> = Vec::new();
        for u in section.upstream {
            let what = format!("{what}, upstream {:?}", u.name);
            super::plain_name(&what, &u.name)?;
            if several && u.name.contains(PREFIX_SEPARATOR) {
                bail!(
                    "{what}: a name with {PREFIX_SEPARATOR:?} would make the combined tool names ({PREFIX_SEPARATOR} between upstream and tool) ambiguous"
                );
            }
            if upstreams.iter().any(|x| x.name == u.name) {
                bail!("{what} is configured twice");
            }
            let transport = transport(
                &what,
                u.command,
                u.cwd,
                u.env,
                &base,
                HttpKeys {
                    url: u.url,
                    bearer_token: u.bearer_token,
                    bearer_token_file: u.bearer_token_file,
                    headers: u.headers,
                    allow_plain_http: u.allow_plain_http.unwrap_or(false),
                },
            )?;
            upstreams.push(UpstreamConfig {
                name: u.name,
                trusted: u.trusted.unwrap_or(false),
                transport,
            });
        }
        out.push(GatewayConfig {
            name: section.name,
            upstreams,
            hold: Duration::from_secs(hold),
            forward_timeout: Duration::from_secs(forward),
        });
    }
    Ok(out)
}

struct HttpKeys {
    url: Option<String>,
    bearer_token: Option<String>,
    bearer_token_file: Option<PathBuf>,
    headers: BTreeMap<String, String>,
    allow_plain_http: bool,
}

fn transport(
    what: &str,
    command: Option<Vec<String>>,
    cwd: Option<PathBuf>,
    env: BTreeMap<String, String>,
    base: &Path,
    http: HttpKeys,
) -> anyhow::Result<Transport> {
    let http_keys = http.bearer_token.is_some()
        || http.bearer_token_file.is_some()
        || !http.headers.is_empty()
        || http.allow_plain_http;
    match (command, http.url) {
        (Some(command), None) => {
            if http_keys {
                bail!(
                    "{what}: bearer_token, headers and allow_plain_http are for a url upstream, not a command"
                );
            }
            if command.first().is_none_or(|p| p.is_empty()) {
                bail!(
                    "{what}: command: give the program and its arguments, e.g. [\"npx\", \"-y\", \"@modelcontextprotocol/server-filesystem\", \"/srv\"]"
                );
            }
            for name in env.keys() {
                if name.is_empty() || name.contains('=') || name.contains('\0') {
                    bail!("{what}: env: {name:?} is not a variable name");
                }
            }
            Ok(Transport::Stdio {
                command,
                cwd: cwd.map(|c| base.join(c)),
                env,
                inherit_env: false,
            })
        }
        (None, Some(url)) => {
            if cwd.is_some() || !env.is_empty() {
                bail!("{what}: cwd and env are for a command upstream, not a url");
            }
            let shown = countersign_server::notify::webhook::redact_url(&url);
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                bail!("{what}: url {shown} must start with https://");
            }
            if countersign_server::notify::webhook::is_plain_http_off_machine(&url)
                && !http.allow_plain_http
            {
                bail!(
                    "{what}: url {shown} is plain http:// to another machine, where anyone on the way reads and changes the calls: use https://, or set allow_plain_http = true in this [[gateway.upstream]] if the network between is trusted"
                );
            }
            let bearer_token = match (http.bearer_token, http.bearer_token_file) {
                (Some(_), Some(_)) => {
                    bail!("{what}: give bearer_token or bearer_token_file, not both")
                }
                (Some(token), None) => Some(token),
                (None, Some(file)) => {
                    let path = base.join(file);
                    let token = std::fs::read_to_string(&path).map_err(|e| {
                        anyhow::anyhow!("{what}: bearer_token_file {}: {e}", path.display())
                    })?;
                    Some(token.trim().to_string())
                }
                (None, None) => None,
            };
            for (name, value) in &http.headers {
                if reqwest::header::HeaderName::try_from(name.as_str()).is_err()
                    || reqwest::header::HeaderValue::try_from(value.as_str()).is_err()
                {
                    bail!("{what}: headers: {name:?} is not a valid header name and value");
                }
            }
            Ok(Transport::Http {
                url,
                bearer_token,
                headers: http.headers,
            })
        }
        (Some(_), Some(_)) => bail!("{what}: give a command or a url, not both"),
        (None, None) => bail!(
            "{what}: give a command (a child process speaking MCP on stdio) or a url (Streamable HTTP)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::ConfigFile;

    #[test]
    fn gateways_resolve_with_their_upstreams() {
        let file = ConfigFile::new();
        std::fs::write(file.dir.path().join("tickets.token"), "s3cret\n").unwrap();
        let config = file
            .resolve(
                r#"
[[gateway]]
name = "tools"
hold_seconds = 120

[[gateway.upstream]]
name = "files"
command = ["npx", "-y", "@modelcontextprotocol/server-filesystem", "/srv"]
cwd = "work"
env = { NODE_ENV = "production" }
trusted = true

[[gateway.upstream]]
name = "tickets"
url = "https://tickets.example.com/mcp"
bearer_token_file = "tickets.token"
headers = { "X-Team" = "ops" }
"#,
            )
            .unwrap();
        assert_eq!(config.gateways.len(), 1);
        let gateway = &config.gateways[0];
        assert_eq!(gateway.name, "tools");
        assert_eq!(gateway.hold.as_secs(), 120);
        assert_eq!(gateway.forward_timeout.as_secs(), 300, "the default");
        let [files, tickets] = &gateway.upstreams[..] else {
            panic!("two upstreams: {gateway:?}")
        };
        assert!(files.trusted && !tickets.trusted, "trusted only when said");
        match &files.transport {
            super::Transport::Stdio {
                command,
                cwd,
                env,
                inherit_env,
            } => {
                assert_eq!(command[0], "npx");
                assert_eq!(cwd.as_deref(), Some(file.dir.path().join("work").as_path()));
                assert_eq!(env["NODE_ENV"], "production");
                assert!(!inherit_env, "the server's environment is not passed on");
            }
            other => panic!("{other:?}"),
        }
        match &tickets.transport {
            super::Transport::Http { bearer_token, .. } => {
                assert_eq!(bearer_token.as_deref(), Some("s3cret"));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            !format!("{config:?}").contains("s3cret"),
            "no token in Debug"
        );
    }

    #[test]
    fn a_bad_gateway_is_refused_with_the_reason() {
        let file = ConfigFile::new();
        let cases = [
            ("[[gateway]]\nname = \"g\"\n", "has no upstream"),
            (
                "[[gateway]]\nname = \"g\"\n[[gateway.upstream]]\nname = \"u\"\n",
                "give a command",
            ),
            (
                "[[gateway]]\nname = \"g\"\n[[gateway.upstream]]\nname = \"u\"\ncommand = [\"x\"]\nurl = \"https://a.example/mcp\"\n",
                "not both",
            ),
            (
                "[[gateway]]\nname = \"g\"\n[[gateway.upstream]]\nname = \"u\"\nurl = \"http://a.example/mcp\"\n",
                "allow_plain_http",
            ),
            (
                "[[gateway]]\nname = \"g\"\n[[gateway.upstream]]\nname = \"u\"\ncommand = []\n",
                "give the program",
            ),
            (
                "[[gateway]]\nname = \"g\"\nhold_seconds = 0\n[[gateway.upstream]]\nname = \"u\"\ncommand = [\"x\"]\n",
                "hold_seconds",
            ),
            (
                "[[gateway]]\nname = \"g\"\n[[gateway.upstream]]\nname = \"a__b\"\ncommand = [\"x\"]\n[[gateway.upstream]]\nname = \"c\"\ncommand = [\"x\"]\n",
                "ambiguous",
            ),
            (
                "[[gateway]]\nname = \"g\"\n[[gateway.upstream]]\nname = \"u\"\ncommand = [\"x\"]\n[[gateway.upstream]]\nname = \"u\"\ncommand = [\"y\"]\n",
                "configured twice",
            ),
            (
                "[[gateway]]\nname = \"g\"\n[[gateway.upstream]]\nname = \"u\"\ncommand = [\"x\"]\n[[gateway]]\nname = \"g\"\n[[gateway.upstream]]\nname = \"u\"\ncommand = [\"x\"]\n",
                "configured twice",
            ),
            (
                "[[gateway]]\nname = \"no spaces\"\n[[gateway.upstream]]\nname = \"u\"\ncommand = [\"x\"]\n",
                "name",
            ),
            (
                "[[gateway]]\nname = \"g\"\n[[gateway.upstream]]\nname = \"u\"\ncommand = [\"x\"]\nbearer_token = \"t\"\n",
                "for a url upstream",
            ),
            (
                "[[gateway]]\nname = \"g\"\n[[gateway.upstream]]\nname = \"u\"\ncommand = [\"x\"]\ntypo = 1\n",
                "unknown field",
            ),
        ];
        for (toml, expected) in cases {
            let err = format!("{:#}", file.resolve(toml).unwrap_err());
            assert!(err.contains(expected), "{toml}\n→ {err}");
        }
        // Plain http to this machine is fine.
        file.resolve(
            "[[gateway]]\nname = \"g\"\n[[gateway.upstream]]\nname = \"u\"\nurl = \"http://127.0.0.1:9000/mcp\"\n",
        )
        .unwrap();
    }
}
