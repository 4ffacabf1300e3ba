//! Every random value the server makes: ids, salts, nonces and secret tokens, in one
//! place so that each has one length and a randomness failure is reported as what it is.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use countersign_core::Timestamp;

use crate::error::GateError;

fn random_bytes<const N: usize>() -> Result<[u8; N], GateError> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| GateError::internal("randomness", e))?;
    Ok(bytes)
}

/// A fresh salt for an event's payload commitment.
pub fn new_salt() -> Result<[u8; 32], GateError> {
    random_bytes::<32>()
}

/// A fresh proof nonce: 16 random bytes, base64url.
pub fn new_nonce() -> Result<String, GateError> {
    Ok(URL_SAFE_NO_PAD.encode(random_bytes::<16>()?))
}

/// `prefix_` + a time-ordered UUIDv7 in hex: sortable, unique across processes. For
/// what is listed by time (requests, recorded decisions).
pub fn new_id(prefix: &str, now: Timestamp) -> Result<String, GateError> {
    let random = random_bytes::<10>()?;
    let millis = u64::try_from(now.millis()).unwrap_or(0);
    let uuid = uuid::Builder::from_unix_timestamp_millis(millis, &random).into_uuid();
    Ok(format!("{prefix}_{}", uuid.simple()))
}

/// `prefix_` + 10 random bytes in hex: for what is not ordered by time (tokens,
/// accounts, invitations, email links).
pub fn short_id(prefix: &str) -> Result<String, GateError> {
    Ok(format!("{prefix}_{}", hex::encode(random_bytes::<10>()?)))
}

/// A new log's origin, `countersign/<12 random hex digits>`: unique to this
/// installation, fixed forever once the log exists.
pub fn log_origin() -> Result<String, GateError> {
    Ok(format!("countersign/{}", hex::encode(random_bytes::<6>()?)))
}

/// 32 random bytes, for a secret (a bearer token's body).
pub fn secret_bytes() -> Result<[u8; 32], GateError> {
    random_bytes::<32>()
}

/// A secret for a URL or a cookie: 32 random bytes, base64url (43 characters). Sessions,
/// CSRF tokens, invitation and email decision links; only their hashes are stored.
pub fn random_token() -> Result<String, GateError> {
    Ok(URL_SAFE_NO_PAD.encode(random_bytes::<32>()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_one_shape_each() {
        let now = Timestamp::from_millis(1_800_000_000_000).unwrap();
        let a = new_id("req", now).unwrap();
        let b = new_id("req", now.plus_seconds(1)).unwrap();
        assert!(a.starts_with("req_") && a.len() == 4 + 32, "{a}");
        assert!(a < b, "time-ordered");
        let short = short_id("tok").unwrap();
        assert_eq!(short.len(), 4 + 20, "{short}");
        assert_ne!(short, short_id("tok").unwrap());
        assert_eq!(random_token().unwrap().len(), 43);
        assert_eq!(new_nonce().unwrap().len(), 22);
    }
}
