//! Job schedules: a one-off instant, or a cron expression in an explicit IANA timezone.
//!
//! Pure functions of their arguments (no clock). Cron fires are computed on local wall-clock
//! times: a local time that a DST change skips is skipped; a local time that a DST change
//! repeats fires once (at its first occurrence).

use std::str::FromStr;

use chrono::{DateTime, LocalResult, TimeZone, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

/// Candidate local times examined for one next fire, at most (DST gaps are short).
const CRON_CANDIDATES_MAX: usize = 1_000;

/// A validated cron schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CronSchedule {
    /// As given: 5 fields (minute first) or 6 (second first).
    pub expr: String,
    pub timezone: String,
}

impl CronSchedule {
    /// Parses `expr` (5 or 6 fields) and `timezone` (an IANA name); the error says which is
    /// wrong.
    pub fn parse(expr: &str, timezone: &str) -> Result<CronSchedule, String> {
        let schedule = CronSchedule { expr: expr.trim().to_string(), timezone: timezone.to_string() };
        schedule.cron()?;
        schedule.tz()?;
        Ok(schedule)
    }

    fn cron(&self) -> Result<cron::Schedule, String> {
        let fields = self.expr.split_whitespace().count();
        let full = match fields {
            5 => format!("0 {}", self.expr),
            6 => self.expr.clone(),
            _ => return Err(format!("cron expression {:?}: 5 or 6 fields expected, got {fields}", self.expr)),
        };
        cron::Schedule::from_str(&full).map_err(|e| format!("cron expression {:?}: {e}", self.expr))
    }

    fn tz(&self) -> Result<Tz, String> {
        self.timezone.parse::<Tz>().map_err(|_| format!("unknown timezone {:?}", self.timezone))
    }

    /// The first fire strictly after `after_ms` (Unix ms), if any.
    pub fn next_after(&self, after_ms: u64) -> Option<u64> {
        let (cron, tz) = (self.cron().ok()?, self.tz().ok()?);
        let after = Utc.timestamp_millis_opt(i64::try_from(after_ms).ok()?).single()?;
        let local_after = after.with_timezone(&tz).naive_local();
        // Iterate in local wall-clock time (labelled UTC so the cron crate sees no DST).
        let candidates = cron.after(&Utc.from_utc_datetime(&local_after));
        for candidate in candidates.take(CRON_CANDIDATES_MAX) {
            let fire: DateTime<Tz> = match tz.from_local_datetime(&candidate.naive_utc()) {
                LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => t,
                LocalResult::None => continue,
            };
            let fire_ms = u64::try_from(fire.timestamp_millis()).ok()?;
            if fire_ms > after_ms {
                return Some(fire_ms);
            }
        }
        None
    }
}

/// Parses an RFC 3339 UTC timestamp (`…Z` or `+00:00`) into Unix ms.
pub fn parse_utc(text: &str) -> Result<u64, String> {
    let parsed =
        DateTime::parse_from_rfc3339(text).map_err(|e| format!("{text:?} is not an RFC 3339 timestamp: {e}"))?;
    if parsed.offset().local_minus_utc() != 0 {
        return Err(format!("{text:?} must be in UTC (Z)"));
    }
    u64::try_from(parsed.timestamp_millis()).map_err(|_| format!("{text:?} is before 1970"))
}

/// Formats Unix ms as RFC 3339 UTC with milliseconds.
pub fn format_utc(ms: u64) -> String {
    Utc.timestamp_millis_opt(ms as i64)
        .single()
        .map_or_else(String::new, |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> u64 {
        parse_utc(text).expect("timestamp")
    }

    fn check(expr: &str, tz: &str, after: &str, expected: &[&str]) {
        let schedule = CronSchedule::parse(expr, tz).expect("valid");
        let mut t = at(after);
        for want in expected {
            t = schedule.next_after(t).expect("a next fire");
            assert_eq!(format_utc(t), *want, "{expr} in {tz}");
        }
    }

    #[test]
    fn new_york_spring_forward_skips_and_fall_back_fires_once() {
        // 2026-03-08: 02:00 EST jumps to 03:00 EDT — 02:30 does not exist that day.
        check(
            "30 2 * * *",
            "America/New_York",
            "2026-03-07T00:00:00Z",
            &["2026-03-07T07:30:00.000Z", "2026-03-09T06:30:00.000Z"],
        );
        // 2026-11-01: 01:30 happens twice (EDT, then EST); it fires at the first only.
        check(
            "30 1 * * *",
            "America/New_York",
            "2026-10-31T12:00:00Z",
            &["2026-11-01T05:30:00.000Z", "2026-11-02T06:30:00.000Z"],
        );
    }

    #[test]
    fn berlin_dst_changes() {
        // 2026-03-29: 02:00 CET jumps to 03:00 CEST.
        check("30 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", &["2026-03-30T00:30:00.000Z"]);
        // 2026-10-25: 02:30 repeats; hourly at :30 fires 02:30 once, then 03:30 CET.
        check(
            "30 * * * *",
            "Europe/Berlin",
            "2026-10-24T23:45:00Z",
            &["2026-10-25T00:30:00.000Z", "2026-10-25T02:30:00.000Z", "2026-10-25T03:30:00.000Z"],
        );
    }

    #[test]
    fn six_fields_and_errors() {
        check(
            "*/10 * * * * *",
            "UTC",
            "2026-01-01T00:00:05Z",
            &["2026-01-01T00:00:10.000Z", "2026-01-01T00:00:20.000Z"],
        );
        assert!(CronSchedule::parse("* * *", "UTC").is_err());
        assert!(CronSchedule::parse("61 * * * *", "UTC").is_err());
        assert!(CronSchedule::parse("* * * * *", "Mars/Olympus").is_err());
        assert!(parse_utc("2026-01-01T00:00:00+02:00").is_err());
        assert!(parse_utc("tomorrow").is_err());
        assert_eq!(parse_utc("1970-01-01T00:00:01Z"), Ok(1_000));
    }
}
