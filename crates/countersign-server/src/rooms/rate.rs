//! How fast one principal may post to rooms: a token bucket per principal id, in this
//! process's memory. A flood from one token is refused with the time to wait; other
//! tokens are not slowed. Several instances each keep their own buckets, so across `n`
//! instances a token may post up to `n` times the rate (documented in docs/rooms.md).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::GateError;

/// The default `[rooms] messages_per_minute`.
pub const DEFAULT_MESSAGES_PER_MINUTE: u32 = 60;

/// Buckets kept before full ones are dropped (a full bucket is the same as none).
const MAX_BUCKETS: usize = 10_000;

struct Bucket {
    tokens: f64,
    at: Instant,
}

pub(crate) struct RateLimit {
    /// Posts per minute, and the burst allowed; 0 means no limit.
    per_minute: u32,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RateLimit {
    pub(crate) fn new(per_minute: u32) -> Self {
        Self {
            per_minute,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one post from `who`'s bucket, or says how long to wait.
    pub(crate) fn take(&self, who: &str) -> Result<(), GateError> {
        self.take_at(who, Instant::now())
    }

    fn take_at(&self, who: &str, now: Instant) -> Result<(), GateError> {
        if self.per_minute == 0 {
            return Ok(());
        }
        let capacity = f64::from(self.per_minute);
        let per_second = capacity / 60.0;
        let mut buckets = self
            .buckets
            .lock()
            .map_err(|_| GateError::Internal("the room rate limit's lock was poisoned".into()))?;
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(who) {
            buckets.retain(|_, b| {
                b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * per_second < capacity
            });
        }
        let bucket = buckets.entry(who.to_string()).or_insert(Bucket {
            tokens: capacity,
            at: now,
        });
        bucket.tokens = (bucket.tokens
            + now.saturating_duration_since(bucket.at).as_secs_f64() * per_second)
            .min(capacity);
        bucket.at = bucket.at.max(now);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        let wait = Duration::from_secs_f64((1.0 - bucket.tokens) / per_second);
        let retry_after_seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        Err(GateError::RateLimited {
            message: format!(
                "{who} posted more than {} room messages in a minute ([rooms] messages_per_minute); retry in {retry_after_seconds} s",
                self.per_minute
            ),
            retry_after_seconds,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_refused_past_the_burst_and_refills_over_time() {
        let limit = RateLimit::new(6);
        let start = Instant::now();
        for _ in 0..6 {
            limit.take_at("token:a", start).unwrap();
        }
        let err = limit.take_at("token:a", start).unwrap_err();
        match &err {
            GateError::RateLimited {
                retry_after_seconds,
                message,
            } => {
                assert_eq!(*retry_after_seconds, 10);
                assert!(message.contains("messages_per_minute"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        limit.take_at("token:b", start).unwrap();
        let later = start + Duration::from_secs(10);
        limit.take_at("token:a", later).unwrap();
        assert!(limit.take_at("token:a", later).is_err());
        assert!(RateLimit::new(0).take("token:a").is_ok());
    }
}
