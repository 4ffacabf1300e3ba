//! Outbound webhooks per the Standard Webhooks spec: `webhook-id`, `webhook-timestamp`
//! and `webhook-signature: v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`,
//! the key being the base64 after `whsec_` in the endpoint's secret.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use countersign_core::Timestamp;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{SendResult, WebhookConfig, WebhookFormat};

/// Decodes a `whsec_...` secret into its key.
pub fn key(secret: &str) -> Result<Vec<u8>, String> {
    let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
    STANDARD
        .decode(encoded)
        .map_err(|e| format!("the webhook secret is not whsec_<base64>: {e}"))
}

/// The `webhook-signature` value for a message.
pub fn signature(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Result<String, String> {
    let mut mac = Hmac::<Sha256>::new_from_slice(&key(secret)?)
        .map_err(|e| format!("bad webhook key: {e}"))?;
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    Ok(format!(
        "v1,{}",
        STANDARD.encode(mac.finalize().into_bytes())
    ))
}

/// `url` as logs and the delivery history show it: a password or user in it, its query
/// string (where tokens often travel) and its fragment replaced by `***`, so a secret
/// put in a webhook URL appears nowhere but the config.
pub fn redact_url(url: &str) -> String {
    let Ok(mut parsed) = reqwest::Url::parse(url) else {
        return "(an unreadable URL)".to_string();
    };
    if !parsed.username().is_empty() || parsed.password().is_some() {
        let _ = parsed.set_username("***");
        let _ = parsed.set_password(None);
    }
    if parsed.query().is_some() {
        parsed.set_query(Some("***"));
    }
    if parsed.fragment().is_some() {
        parsed.set_fragment(Some("***"));
    }
    parsed.to_string()
}

/// Whether a plain `http://` URL goes only to this machine (`https://` always may).
pub fn is_plain_http_off_machine(url: &str) -> bool {
    match reqwest::Url::parse(url) {
        Ok(u) if u.scheme() == "http" => !u.host_str().is_some_and(crate::hosts::is_loopback),
        _ => false,
    }
}

/// The header LoopPause's HMAC signature travels in (`format = "looppause"`).
pub const LOOPPAUSE_HEADER: &str = "x-looppause-signature";

/// LoopPause's signature of a body: `sha256=` + hex HMAC-SHA256 keyed by the secret's
/// bytes as they are.
pub fn looppause_signature(secret: &str, body: &[u8]) -> Result<String, String> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes())
        .map_err(|e| format!("bad webhook key: {e}"))?;
    mac.update(body);
    Ok(format!(
        "sha256={}",
        hex::encode(mac.finalize().into_bytes())
    ))
}

/// Posts one message; any 2xx is success. Errors name the URL redacted.
pub async fn send(
    http: &reqwest::Client,
    config: &WebhookConfig,
    id: &str,
    now: Timestamp,
    body: &[u8],
) -> SendResult {
    let url = config.url.as_str();
    let timestamp = now.millis() / 1000;
    let mut request = http
        .post(url)
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string());
    request = match config.format {
        WebhookFormat::Standard => request.header(
            "webhook-signature",
            signature(&config.secret, id, timestamp, body)?,
        ),
        WebhookFormat::LoopPause => {
            request.header(LOOPPAUSE_HEADER, looppause_signature(&config.secret, body)?)
        }
    };
    let response = request
        .body(body.to_vec())
        .send()
        .await
        // The error's own text would repeat the URL whole.
        .map_err(|e| format!("could not reach {}: {}", redact_url(url), e.without_url()))?;
    let status = response.status();
    if status.is_success() {
        Ok(Some(serde_json::json!({"status": status.as_u16()})))
    } else {
        Err(format!("{} answered {status}", redact_url(url)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_in_urls_are_redacted() {
        assert_eq!(
            redact_url("https://bot:hunter2@hooks.example.com/in/abc?token=s3cret#frag"),
            "https://***@hooks.example.com/in/abc?***#***"
        );
        assert_eq!(
            redact_url("https://hooks.example.com/countersign"),
            "https://hooks.example.com/countersign"
        );
        assert!(!redact_url("http://:pw@127.0.0.1:9/x").contains("pw"));
        assert!(is_plain_http_off_machine("http://hooks.example.com/x"));
        assert!(!is_plain_http_off_machine("http://127.0.0.1:9/x"));
        assert!(!is_plain_http_off_machine("http://[::1]:9/x"));
        assert!(!is_plain_http_off_machine("https://hooks.example.com/x"));
    }

    #[test]
    fn matches_the_standard_webhooks_reference_example() {
        // From the Standard Webhooks specification's test vector.
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let id = "msg_p5jXN8AQM9LWM0D4loKWxJek";
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            signature(secret, id, 1614265330, body).unwrap(),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        assert!(signature("whsec_!!!", id, 1, body).is_err());
    }

    #[test]
    fn looppause_signature_is_hex_hmac_sha256_of_the_body() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        assert_eq!(
            looppause_signature("Jefe", b"what do ya want for nothing?").unwrap(),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
