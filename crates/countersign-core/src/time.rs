//! Time: a `Clock` is passed in, so expiry logic is deterministic in tests, and every
//! time countersign writes is UTC RFC 3339 with millisecond precision and a `Z` suffix.

use std::sync::Mutex;

use chrono::{DateTime, Duration, SecondsFormat, TimeZone, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A UTC instant with millisecond precision, written as RFC 3339 (`2026-11-29T11:43:06.123Z`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(DateTime<Utc>);

impl Timestamp {
    /// Truncates to whole milliseconds, the precision countersign stores and signs.
    pub fn from_datetime(at: DateTime<Utc>) -> Self {
        let millis = at.timestamp_millis();
        Self::from_millis(millis).unwrap_or(Self(at))
    }

    pub fn from_millis(millis: i64) -> Option<Self> {
        Utc.timestamp_millis_opt(millis).single().map(Self)
    }

    pub fn millis(&self) -> i64 {
        self.0.timestamp_millis()
    }

    pub fn datetime(&self) -> DateTime<Utc> {
        self.0
    }

    pub fn parse(text: &str) -> Result<Self, chrono::ParseError> {
        DateTime::parse_from_rfc3339(text).map(|t| Self::from_datetime(t.with_timezone(&Utc)))
    }

    /// Adds `seconds`, saturating at the end of representable time.
    pub fn plus_seconds(&self, seconds: u64) -> Self {
        let secs = i64::try_from(seconds).unwrap_or(i64::MAX);
        match Duration::try_seconds(secs).and_then(|d| self.0.checked_add_signed(d)) {
            Some(t) => Self(t),
            None => Self(DateTime::<Utc>::MAX_UTC),
        }
    }

    /// Milliseconds from `self` until `later` (negative when `later` is earlier).
    pub fn millis_until(&self, later: Timestamp) -> i64 {
        later.millis().saturating_sub(self.millis())
    }
}

impl std::fmt::Display for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.to_rfc3339_opts(SecondsFormat::Millis, true))
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Timestamp::parse(&text)
            .map_err(|e| serde::de::Error::custom(format!("invalid RFC 3339 time {text:?}: {e}")))
    }
}

/// The source of the current time. Domain code never reads the system clock itself.
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_datetime(Utc::now())
    }
}

/// A clock that stands still until told to move: for tests of expiry and validity.
#[derive(Debug)]
pub struct FixedClock(Mutex<Timestamp>);

impl FixedClock {
    pub fn new(at: Timestamp) -> Self {
        Self(Mutex::new(at))
    }

    pub fn advance_seconds(&self, seconds: u64) {
        if let Ok(mut now) = self.0.lock() {
            *now = now.plus_seconds(seconds);
        }
    }

    pub fn set(&self, at: Timestamp) {
        if let Ok(mut now) = self.0.lock() {
            *now = at;
        }
    }
}

impl Clock for FixedClock {
    fn now(&self) -> Timestamp {
        match self.0.lock() {
            Ok(now) => *now,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_with_millis_and_z() {
        let t = Timestamp::parse("2026-11-29T12:43:06.123456+01:00").unwrap();
        assert_eq!(t.to_string(), "2026-11-29T11:43:06.123Z");
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            "\"2026-11-29T11:43:06.123Z\""
        );
    }

    #[test]
    fn plus_seconds_and_millis_until() {
        let t = Timestamp::from_millis(1_000).unwrap();
        let later = t.plus_seconds(90);
        assert_eq!(t.millis_until(later), 90_000);
        assert_eq!(later.millis_until(t), -90_000);
    }

    #[test]
    fn rejects_times_without_offset() {
        assert!(Timestamp::parse("2026-11-29T11:43:06").is_err());
    }
}
