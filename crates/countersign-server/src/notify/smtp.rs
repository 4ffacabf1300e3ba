//! SMTP: the `smtp_url` forms and what they protect, the connection (lettre, rustls,
//! an optional private CA), sending one message, and errors in words.
//!
//! The SMTP URL: `smtps://host[:port]` (TLS from the first byte, port 465 by default),
//! `smtp://host[:port]?tls=starttls` (STARTTLS required, port 587 by default), or plain
//! `smtp://host[:port]` (port 25), which is refused unless the host is the loopback
//! (a local relay).

use std::time::Duration;

use lettre::message::{Mailbox, MultiPart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use super::EmailConfig;
use super::permanent;

/// How the connection to the SMTP server is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Security {
    /// No TLS: only to a relay on the loopback.
    Plain,
    /// Plain first, then STARTTLS, which must succeed before anything is sent.
    StartTls,
    /// TLS from the first byte (SMTPS).
    Tls,
}

/// A parsed `smtp_url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmtpUrl {
    pub host: String,
    pub port: u16,
    pub security: Security,
}

impl SmtpUrl {
    /// Parses `smtps://host[:port]`, `smtp://host[:port]?tls=starttls` or (loopback only)
    /// `smtp://host[:port]`.
    pub fn parse(url: &str) -> Result<Self, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| format!("smtp_url {url:?} must start with smtps:// or smtp://"))?;
        let (authority, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let authority = authority.trim_end_matches('/');
        if authority.contains('@') {
            return Err(format!(
                "smtp_url {:?} carries credentials: give them as [email] username and password (or password_file)",
                redact_userinfo(url)
            ));
        }
        if authority.contains('/') {
            return Err(format!("smtp_url {url:?} must not have a path"));
        }
        let starttls = match query {
            None | Some("") => false,
            Some("tls=starttls") => true,
            Some(other) => {
                return Err(format!(
                    "smtp_url {url:?}: unknown option {other:?} (the only one is tls=starttls)"
                ));
            }
        };
        let security = match (scheme, starttls) {
            ("smtps", false) => Security::Tls,
            ("smtps", true) => {
                return Err(format!(
                    "smtp_url {url:?}: smtps:// is TLS already; use smtp://…?tls=starttls for STARTTLS"
                ));
            }
            ("smtp", true) => Security::StartTls,
            ("smtp", false) => Security::Plain,
            _ => {
                return Err(format!(
                    "smtp_url {url:?} must start with smtps:// or smtp://"
                ));
            }
        };
        let (host, port) = split_host_port(authority)
            .ok_or_else(|| format!("smtp_url {url:?} has no valid host[:port]"))?;
        let port = port.unwrap_or(match security {
            Security::Plain => 25,
            Security::StartTls => 587,
            Security::Tls => 465,
        });
        if security == Security::Plain && !crate::hosts::is_loopback(&host) {
            return Err(format!(
                "smtp_url {url:?} would send mail (and any password) unencrypted over the network; use smtps://{host} (TLS, port 465) or smtp://{host}:587?tls=starttls. Plain smtp:// is only allowed to a relay on the loopback (127.0.0.1, ::1, localhost)"
            ));
        }
        Ok(Self {
            host,
            port,
            security,
        })
    }

    /// For messages: the URL without secrets, and how it is protected.
    pub fn describe(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        match self.security {
            Security::Plain => format!("smtp://{host}:{} (plain, loopback)", self.port),
            Security::StartTls => format!("smtp://{host}:{} (STARTTLS)", self.port),
            Security::Tls => format!("smtps://{host}:{} (TLS)", self.port),
        }
    }
}

fn redact_userinfo(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}***{}", &url[..s + 3], &url[at..]),
        _ => url.to_string(),
    }
}

fn split_host_port(authority: &str) -> Option<(String, Option<u16>)> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.parse().ok()?),
            None if after.is_empty() => None,
            None => return None,
        };
        return Some((host.to_string(), port));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h, Some(p.parse().ok()?)),
        None => (authority, None),
    };
    if host.is_empty() || host.contains(':') {
        return None;
    }
    Some((host.to_ascii_lowercase(), port))
}

/// Whether `address` is a valid mailbox (`a@b.c` or `Name <a@b.c>`).
pub fn check_address(address: &str) -> Result<(), String> {
    address
        .parse::<Mailbox>()
        .map(|_| ())
        .map_err(|e| format!("{address:?} is not an email address: {e}"))
}

/// Reads `[email] ca_file`: PEM with at least one certificate, which the SMTP server's
/// certificate may chain to besides the Mozilla roots.
pub fn load_ca_file(path: &std::path::Path) -> Result<Vec<u8>, String> {
    let pem = std::fs::read(path)
        .map_err(|e| format!("[email] ca_file {}: cannot read it: {e}", path.display()))?;
    let count = pem
        .windows(b"-----BEGIN CERTIFICATE-----".len())
        .filter(|w| *w == b"-----BEGIN CERTIFICATE-----")
        .count();
    if count == 0 {
        return Err(format!(
            "[email] ca_file {}: no PEM certificate in it (-----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Certificate::from_pem(&pem).map_err(|e| format!("[email] ca_file {}: {e}", path.display()))?;
    Ok(pem)
}

fn transport(
    config: &EmailConfig,
    timeout: Duration,
) -> Result<AsyncSmtpTransport<Tokio1Executor>, String> {
    let host = config.smtp.host.as_str();
    let setup = |e: lettre::transport::smtp::Error| format!("TLS setup for {host}: {e}");
    let mut builder = match config.smtp.security {
        Security::Plain => AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host),
        Security::StartTls => {
            AsyncSmtpTransport::<Tokio1Executor>::starttls_relay(host).map_err(setup)?
        }
        Security::Tls => AsyncSmtpTransport::<Tokio1Executor>::relay(host).map_err(setup)?,
    };
    // A private CA: the same TLS mode, with its certificates trusted besides the roots.
    let tls: Option<fn(TlsParameters) -> Tls> = match config.smtp.security {
        Security::Plain => None,
        Security::StartTls => Some(Tls::Required),
        Security::Tls => Some(Tls::Wrapper),
    };
    if let (Some(pem), Some(tls)) = (&config.extra_roots, tls) {
        let parameters = TlsParameters::builder(host.to_string())
            .add_root_certificate(Certificate::from_pem(pem).map_err(setup)?)
            .build()
            .map_err(setup)?;
        builder = builder.tls(tls(parameters));
    }
    let mut builder = builder.port(config.smtp.port).timeout(Some(timeout));
    if let Some(user) = &config.username {
        builder = builder.credentials(Credentials::new(
            user.clone(),
            config.password.clone().unwrap_or_default(),
        ));
    }
    Ok(builder.build())
}

/// An SMTP error in words, with what lies beneath it.
fn words(config: &EmailConfig, err: &lettre::transport::smtp::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    let hint = if text.contains("UnknownIssuer") || text.contains("invalid peer certificate") {
        " (the server's certificate is not trusted: if it comes from a private CA, give that \
         CA's certificate as [email] ca_file)"
    } else if err.is_tls() {
        " (TLS failed: is the port right for this URL form, and does the certificate match the host?)"
    } else if err.is_permanent() && text.contains("535") {
        " (the server refused the username or password)"
    } else if err.is_timeout() {
        " (no answer in time)"
    } else {
        ""
    };
    format!("{}: {text}{hint}", config.smtp.describe())
}

/// Connects (and, with credentials, authenticates) without sending anything.
pub async fn test_connection(config: &EmailConfig) -> Result<(), String> {
    let transport = transport(config, Duration::from_secs(15))?;
    match transport.test_connection().await {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!(
            "{} accepted the connection but did not answer NOOP",
            config.smtp.describe()
        )),
        Err(e) => Err(words(config, &e)),
    }
}

pub(super) async fn deliver(
    config: &EmailConfig,
    message: Message,
    timeout: Duration,
) -> Result<(), String> {
    let transport = transport(config, timeout)?;
    match transport.send(message).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_permanent() => Err(permanent(words(config, &e))),
        Err(e) => Err(words(config, &e)),
    }
}

pub(super) fn build(
    config: &EmailConfig,
    to: &str,
    subject: &str,
    message_id: Option<String>,
    text: String,
    html: String,
) -> Result<Message, String> {
    let from: Mailbox = config
        .from
        .parse()
        .map_err(|e| permanent(format!("[email] from {:?}: {e}", config.from)))?;
    let to: Mailbox = to
        .parse()
        .map_err(|e| permanent(format!("{to:?} is not an email address: {e}")))?;
    let domain = from.email.domain().to_string();
    Message::builder()
        .from(from)
        .to(to)
        .subject(subject)
        .message_id(message_id.map(|id| format!("<{id}@{domain}>")))
        .header(AutoSubmitted)
        .multipart(MultiPart::alternative_plain_html(text, html))
        .map_err(|e| permanent(format!("could not build the message: {e}")))
}

/// `Auto-Submitted: auto-generated` (RFC 3834), so auto-responders stay quiet.
#[derive(Clone)]
struct AutoSubmitted;

impl lettre::message::header::Header for AutoSubmitted {
    fn name() -> lettre::message::header::HeaderName {
        lettre::message::header::HeaderName::new_from_ascii_str("Auto-Submitted")
    }
    fn parse(_: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Self)
    }
    fn display(&self) -> lettre::message::header::HeaderValue {
        lettre::message::header::HeaderValue::new(Self::name(), "auto-generated".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smtp_urls_say_how_they_are_protected() {
        let tls = SmtpUrl::parse("smtps://mail.example.com").unwrap();
        assert_eq!((tls.port, tls.security), (465, Security::Tls));
        let st = SmtpUrl::parse("smtp://mail.example.com:2587?tls=starttls").unwrap();
        assert_eq!((st.port, st.security), (2587, Security::StartTls));
        let local = SmtpUrl::parse("smtp://127.0.0.1:2525").unwrap();
        assert_eq!((local.port, local.security), (2525, Security::Plain));
        assert!(SmtpUrl::parse("smtp://[::1]:25").is_ok());
        assert!(SmtpUrl::parse("smtp://localhost").is_ok());

        let plain = SmtpUrl::parse("smtp://mail.example.com").unwrap_err();
        assert!(plain.contains("unencrypted"), "{plain}");
        assert!(SmtpUrl::parse("smtp://10.0.0.1:25").is_err());
        let creds = SmtpUrl::parse("smtps://bob:hunter2@mail.example.com").unwrap_err();
        assert!(!creds.contains("hunter2"), "{creds}");
        assert!(SmtpUrl::parse("smtps://mail.example.com?tls=starttls").is_err());
        assert!(SmtpUrl::parse("smtp://mail.example.com?tls=none").is_err());
        assert!(SmtpUrl::parse("http://mail.example.com").is_err());
        assert!(SmtpUrl::parse("smtps://mail.example.com:notaport").is_err());
    }
}
