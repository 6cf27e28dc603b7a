//! Job schedules: a one-off instant, or a cron expression in an explicit IANA timezone.
//!
//! Cron follows standard (Vixie/Debian) cron: 5 fields `minute hour day-of-month month
//! day-of-week` (6 with seconds first also accepted); day of week 0–7 with 0 and 7 = Sunday,
//! names `SUN`–`SAT` and `JAN`–`DEC`; when both day of month and day of week are restricted
//! (neither starts with `*`), a day matching either fires. The `cron` crate evaluates the fields
//! (its own day-of-week numbering is 1 = Sunday, and it ANDs the day fields), so the
//! day-of-week field is translated and the OR case runs as two schedules.
//!
//! DST follows Debian cron. A job at a fixed local time (5 fields, minute and hour not starting
//! with `*`, e.g. `30 2 * * *`) is computed on local wall-clock times: a time that a DST change
//! skips fires at the first instant after the gap (several in one gap coalesce into one), a
//! time that a DST change repeats fires once, at its first occurrence. Every other schedule
//! (`*/15 * * * *`, `0 */2 * * *`, 6 fields) follows real time: it fires at each instant whose
//! local time matches, so an interval job keeps its interval across a change — a skipped
//! local time does not exist, a repeated hour fires again. Checked against an independent
//! implementation's tables (`tests/data/cron_next_fires.json`). Pure functions of their
//! arguments (no clock), so they may run inside `apply`.

use std::collections::BTreeSet;
use std::str::FromStr;

use chrono::{DateTime, Duration, LocalResult, NaiveDateTime, Offset, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

/// Candidate local times examined for one next fire, at most.
const CRON_CANDIDATES_MAX: usize = 1_000;
/// Longest DST gap searched for its end, in minutes (real gaps are 30 or 60).
const DST_GAP_MINUTES_MAX: i64 = 24 * 60;
/// UTC-offset changes crossed while looking for one real-time fire, at most.
const OFFSET_CHANGES_MAX: usize = 64;
/// Step of the search for an offset change between two instants, in seconds (real zones
/// change their offset weeks apart).
const OFFSET_PROBE_S: i64 = 24 * 3600;
/// Day-of-week names in standard numbering (0 = Sunday).
const DAY_NAMES: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

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
        schedule.compile()?;
        schedule.tz()?;
        Ok(schedule)
    }

    /// The `cron` crate schedules whose union is this expression.
    fn compile(&self) -> Result<Vec<cron::Schedule>, String> {
        let mut fields: Vec<&str> = self.expr.split_whitespace().collect();
        match fields.len() {
            5 => fields.insert(0, "0"),
            6 => {}
            n => return Err(format!("cron expression {:?}: 5 or 6 fields expected, got {n}", self.expr)),
        }
        let bad = |e: String| format!("cron expression {:?}: {e}", self.expr);
        let days = days_of_week(fields[5]).map_err(bad)?;
        let dow_list = days.iter().map(|d| (d + 1).to_string()).collect::<Vec<_>>().join(",");
        let starred = |field: &str| field.starts_with(['*', '?']);
        let [sec, min, hour, dom, month, dow] = [fields[0], fields[1], fields[2], fields[3], fields[4], fields[5]];
        let exprs = if !starred(dom) && !starred(dow) {
            vec![format!("{sec} {min} {hour} {dom} {month} *"), format!("{sec} {min} {hour} * {month} {dow_list}")]
        } else {
            vec![format!("{sec} {min} {hour} {dom} {month} {dow_list}")]
        };
        exprs
            .iter()
            .map(|e| cron::Schedule::from_str(e).map_err(|err| format!("cron expression {:?}: {err}", self.expr)))
            .collect()
    }

    fn tz(&self) -> Result<Tz, String> {
        self.timezone.parse::<Tz>().map_err(|_| format!("unknown timezone {:?}", self.timezone))
    }

    /// The first fire strictly after `after_ms` (Unix ms), if any.
    pub fn next_after(&self, after_ms: u64) -> Option<u64> {
        let (schedules, tz) = (self.compile().ok()?, self.tz().ok()?);
        let after = Utc.timestamp_millis_opt(i64::try_from(after_ms).ok()?).single()?;
        let fire = if self.fixed_time() { next_wall_clock_fire } else { next_real_time_fire };
        let next = schedules.iter().filter_map(|schedule| fire(schedule, tz, after)).min()?;
        u64::try_from(next.timestamp_millis()).ok()
    }

    /// Debian cron's "fixed time" job: 5 fields whose minute and hour do not start with `*`.
    fn fixed_time(&self) -> bool {
        let fields: Vec<&str> = self.expr.split_whitespace().collect();
        fields.len() == 5 && !fields[0].starts_with(['*', '?']) && !fields[1].starts_with(['*', '?'])
    }
}

/// The first fire of a fixed-time schedule after `after`, on `tz`'s wall clock: a skipped local
/// time fires at the end of the gap, a repeated one at its first occurrence only.
fn next_wall_clock_fire(schedule: &cron::Schedule, tz: Tz, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let local_after = after.with_timezone(&tz).naive_local();
    // Iterate in local wall-clock time (labelled UTC so the cron crate sees no DST).
    for candidate in schedule.after(&Utc.from_utc_datetime(&local_after)).take(CRON_CANDIDATES_MAX) {
        let fire = match tz.from_local_datetime(&candidate.naive_utc()) {
            LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => t,
            LocalResult::None => gap_end(tz, candidate.naive_utc())?,
        };
        if fire > after {
            return Some(fire.with_timezone(&Utc));
        }
    }
    None
}

/// The first instant after `after` whose local time in `tz` matches `schedule`. Between two
/// offset changes local time is UTC plus a constant, so the search runs the schedule on that
/// segment's local times and moves to the next segment when the candidate lies beyond it.
fn next_real_time_fire(schedule: &cron::Schedule, tz: Tz, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
    // Fires are searched from `start` on, inclusive; `offset` holds from `start` until the next change.
    let mut start = after.checked_add_signed(Duration::milliseconds(1))?;
    for _ in 0..OFFSET_CHANGES_MAX {
        let offset = offset_at(tz, start);
        let local_before = start.naive_utc().checked_add_signed(offset - Duration::milliseconds(1))?;
        let local = schedule.after(&Utc.from_utc_datetime(&local_before)).next()?;
        let fire = Utc.from_utc_datetime(&local.naive_utc().checked_sub_signed(offset)?);
        match offset_change(tz, start, fire, offset) {
            None => return Some(fire),
            Some(change) => start = change,
        }
    }
    None
}

/// `tz`'s UTC offset at `at`.
fn offset_at(tz: Tz, at: DateTime<Utc>) -> Duration {
    Duration::seconds(i64::from(tz.offset_from_utc_datetime(&at.naive_utc()).fix().local_minus_utc()))
}

/// The first instant in `(from, to]` at which `tz`'s offset is no longer `offset` (the offset
/// at `from`), to the second (zones change on whole seconds).
fn offset_change(tz: Tz, from: DateTime<Utc>, to: DateTime<Utc>, offset: Duration) -> Option<DateTime<Utc>> {
    let (from_s, to_s) = (from.timestamp(), to.timestamp());
    let differs = |s: i64| Utc.timestamp_opt(s, 0).single().is_some_and(|t| offset_at(tz, t) != offset);
    let mut low = from_s;
    let mut high = loop {
        let probe = low.saturating_add(OFFSET_PROBE_S).min(to_s);
        if differs(probe) {
            break probe;
        }
        if probe >= to_s {
            return None;
        }
        low = probe;
    };
    // `low` has the offset, `high` does not: bisect to the first second that does not.
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if differs(mid) {
            high = mid;
        } else {
            low = mid;
        }
    }
    Utc.timestamp_opt(high, 0).single()
}

/// The first instant after the DST gap that swallowed the local time `missing`: the first
/// whole local minute after it that exists.
fn gap_end(tz: Tz, missing: NaiveDateTime) -> Option<DateTime<Tz>> {
    let minute = missing.with_second(0)?.with_nanosecond(0)?;
    (1..=DST_GAP_MINUTES_MAX).find_map(|m| {
        match tz.from_local_datetime(&minute.checked_add_signed(Duration::minutes(m))?) {
            LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => Some(t),
            LocalResult::None => None,
        }
    })
}

/// The days a day-of-week field names, in standard numbering (0 = Sunday … 6 = Saturday):
/// lists, ranges `a-b`, steps `/n`, `*`, numbers 0–7 (7 = Sunday) and names.
fn days_of_week(field: &str) -> Result<BTreeSet<u32>, String> {
    let mut days = BTreeSet::new();
    for item in field.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => {
                let step: u32 = step.parse().map_err(|_| format!("bad step in day of week {item:?}"))?;
                if step == 0 {
                    return Err(format!("zero step in day of week {item:?}"));
                }
                (range, step)
            }
            None => (item, 1),
        };
        let (first, last) = match range {
            "*" | "?" => (0, 6),
            _ => match range.split_once('-') {
                Some((a, b)) => (day(a)?, day(b)?),
                None if step > 1 => (day(range)?, 7),
                None => (day(range)?, day(range)?),
            },
        };
        if first > last {
            return Err(format!("day-of-week range {range:?} runs backwards"));
        }
        days.extend((first..=last).step_by(step as usize).map(|d| d % 7));
    }
    Ok(days)
}

/// One day of week: 0–7 (0 and 7 = Sunday) or a three-letter name.
fn day(text: &str) -> Result<u32, String> {
    if let Ok(n) = text.parse::<u32>() {
        return if n <= 7 { Ok(n) } else { Err(format!("day of week {n} is not 0–7")) };
    }
    let lower = text.to_ascii_lowercase();
    DAY_NAMES
        .iter()
        .position(|name| lower == *name)
        .map(|i| i as u32)
        .ok_or_else(|| format!("{text:?} is not a day of week"))
}

/// Parses an RFC 3339 UTC timestamp (`…Z` or `+00:00`) into Unix ms.
pub fn parse_utc(text: &str) -> Result<u64, String> {
    u64::try_from(parse_utc_signed(text)?).map_err(|_| format!("{text:?} is before 1970"))
}

/// Parses an RFC 3339 UTC timestamp into Unix ms, negative before 1970.
pub fn parse_utc_signed(text: &str) -> Result<i64, String> {
    let parsed =
        DateTime::parse_from_rfc3339(text).map_err(|e| format!("{text:?} is not an RFC 3339 timestamp: {e}"))?;
    if parsed.offset().local_minus_utc() != 0 {
        return Err(format!("{text:?} must be in UTC (Z)"));
    }
    Ok(parsed.timestamp_millis())
}

/// Parses an RFC 3339 timestamp with any offset into Unix ms.
pub fn parse_timestamp(text: &str) -> Result<u64, String> {
    u64::try_from(parse_signed_ms(text)?).map_err(|_| format!("{text:?} is before 1970"))
}

/// Parses an RFC 3339 timestamp with any offset into Unix ms, negative before 1970.
pub fn parse_signed_ms(text: &str) -> Result<i64, String> {
    let parsed =
        DateTime::parse_from_rfc3339(text).map_err(|e| format!("{text:?} is not an RFC 3339 timestamp: {e}"))?;
    Ok(parsed.timestamp_millis())
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
    fn new_york_spring_forward_runs_after_the_gap_and_fall_back_fires_once() {
        // 2026-03-08: 02:00 EST jumps to 03:00 EDT — 02:30 does not exist that day: the fire
        // runs at the first instant after the gap, 03:00 EDT (07:00Z).
        check(
            "30 2 * * *",
            "America/New_York",
            "2026-03-07T00:00:00Z",
            &["2026-03-07T07:30:00.000Z", "2026-03-08T07:00:00.000Z", "2026-03-09T06:30:00.000Z"],
        );
        // Fixed times in one gap coalesce into that one fire.
        check(
            "0,30 2 * * *",
            "America/New_York",
            "2026-03-08T06:50:00Z",
            &["2026-03-08T07:00:00.000Z", "2026-03-09T06:00:00.000Z"],
        );
        // A quarter-hourly job follows real time: no 02:xx exists that day, 03:00 EDT comes next.
        check(
            "*/15 2,3 * * *",
            "America/New_York",
            "2026-03-08T06:50:00Z",
            &["2026-03-08T07:00:00.000Z", "2026-03-08T07:15:00.000Z"],
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
        // 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00Z); 02:30 fires then.
        check(
            "30 2 * * *",
            "Europe/Berlin",
            "2026-03-28T12:00:00Z",
            &["2026-03-29T01:00:00.000Z", "2026-03-30T00:30:00.000Z"],
        );
        // 2026-10-25: 02:30 repeats. A fixed-time job fires at the first 02:30 only; an hourly
        // job follows real time and fires in both hours, then 03:30 CET.
        check(
            "30 2 * * *",
            "Europe/Berlin",
            "2026-10-24T12:00:00Z",
            &["2026-10-25T00:30:00.000Z", "2026-10-26T01:30:00.000Z"],
        );
        check(
            "30 * * * *",
            "Europe/Berlin",
            "2026-10-24T23:45:00Z",
            &["2026-10-25T00:30:00.000Z", "2026-10-25T01:30:00.000Z", "2026-10-25T02:30:00.000Z"],
        );
        // 2026-03-29: an hourly job at :30 has no 02:30 that day; one hour after 01:30 CET
        // comes 03:30 CEST.
        check(
            "30 * * * *",
            "Europe/Berlin",
            "2026-03-29T00:15:00Z",
            &["2026-03-29T00:30:00.000Z", "2026-03-29T01:30:00.000Z"],
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
        assert_eq!(parse_timestamp("1970-01-01T02:00:01+02:00"), Ok(1_000));
        assert!(parse_timestamp("1969-12-31T23:59:59Z").is_err());
    }

    #[test]
    fn standard_day_of_week_numbering() {
        // 2026-11-22 is a Sunday. Monday–Friday at 09:00 UTC: Mon 23 … Fri 27, then Mon 30.
        check(
            "0 9 * * 1-5",
            "UTC",
            "2026-11-22T00:00:00Z",
            &[
                "2026-11-23T09:00:00.000Z",
                "2026-11-24T09:00:00.000Z",
                "2026-11-25T09:00:00.000Z",
                "2026-11-26T09:00:00.000Z",
                "2026-11-27T09:00:00.000Z",
                "2026-11-30T09:00:00.000Z",
            ],
        );
        for sunday in ["0", "7", "SUN", "sun"] {
            check(&format!("0 9 * * {sunday}"), "UTC", "2026-11-22T10:00:00Z", &["2026-11-29T09:00:00.000Z"]);
        }
        check("0 9 * * MON-FRI", "UTC", "2026-11-27T10:00:00Z", &["2026-11-30T09:00:00.000Z"]);
        check("0 9 * * 5-7", "UTC", "2026-11-23T10:00:00Z", &["2026-11-27T09:00:00.000Z", "2026-11-28T09:00:00.000Z"]);
        assert!(CronSchedule::parse("0 9 * * 8", "UTC").is_err());
        assert!(CronSchedule::parse("0 9 * * 5-1", "UTC").is_err());
        assert!(CronSchedule::parse("0 9 * * FUNDAY", "UTC").is_err());
    }

    #[test]
    fn day_of_month_or_day_of_week_when_both_are_restricted() {
        // The 1st and 15th of the month, and every Monday: 2026-12-01 is a Tuesday.
        check(
            "0 0 1,15 * 1",
            "UTC",
            "2026-11-29T12:00:00Z",
            &["2026-11-30T00:00:00.000Z", "2026-12-01T00:00:00.000Z", "2026-12-07T00:00:00.000Z"],
        );
        // A starred day of month keeps AND: every other day that is a Monday.
        check("0 0 */2 * 1", "UTC", "2026-11-29T12:00:00Z", &["2026-12-07T00:00:00.000Z"]);
    }

    #[test]
    fn next_fires_match_an_independent_implementation() {
        let table: serde_json::Value =
            serde_json::from_str(include_str!("../tests/data/cron_next_fires.json")).expect("table parses");
        let cases = table["cases"].as_array().expect("cases");
        let mut failures = Vec::new();
        for case in cases {
            let (expr, tz, after) = (
                case["expr"].as_str().unwrap_or(""),
                case["timezone"].as_str().unwrap_or(""),
                case["after"].as_str().unwrap_or(""),
            );
            let schedule = CronSchedule::parse(expr, tz).expect("valid expression in the table");
            let mut t = at(after);
            for want in case["next"].as_array().expect("next") {
                let got = schedule.next_after(t).map(format_utc);
                if got.as_deref() != want.as_str() {
                    failures.push(format!("{expr:?} in {tz} after {}: got {got:?}, want {want}", format_utc(t)));
                    break;
                }
                t = at(want.as_str().unwrap_or(""));
            }
        }
        let expressions: std::collections::BTreeSet<&str> = cases.iter().filter_map(|c| c["expr"].as_str()).collect();
        assert!(
            expressions.len() >= 50 && cases.len() >= 250,
            "{} expressions, {} cases",
            expressions.len(),
            cases.len()
        );
        assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
    }
}
