#!/usr/bin/env python3
"""Generates cron_next_fires.json: next-fire tables from an independent implementation.

The reference is `cronsim` (PyPI, the evaluator behind Healthchecks.io), which mirrors Debian's
Vixie cron, DST rules included: a job at a fixed local time (5 fields, minute and hour not
starting with `*`) runs at the first instant after a spring-forward gap and once in a repeated
hour; every other job follows real time (a skipped local time does not exist, a repeated one
fires in both hours). `storage/src/schedule.rs` must agree with every row.

Fires of real-time schedules are checked against a second-by-second walk before they are
written (cronsim's jumps skip a valid time across half-hour DST shifts, so zones like
Australia/Lord_Howe are left out). Run once, keep the output:  pip install cronsim==2.8 && python3 gen_cron_next_fires.py
"""
import json
from datetime import datetime, timedelta, timezone
from importlib.metadata import version
from zoneinfo import ZoneInfo

import cronsim

EXPRESSIONS = [
    # fixed local times
    "0 0 * * *", "30 2 * * *", "0 2 * * *", "59 1 * * *", "30 1 * * *", "0 3 * * *",
    "15 2 * * 0", "45 2 1 * *", "0 9 * * 1-5", "0 9 * * MON-FRI", "0 17 * * 5", "30 8 * * 1,3,5",
    "0 12 1 1 *", "0 0 29 2 *", "0 0 31 * *", "0 0 1,15 * 1", "0 6 1-7 * 1", "0 2,3 * * *",
    "0 1-3 * * *", "0,30 2 * * *", "10,40 1,2 * * *", "0 12 * JAN,JUL *", "0 0 * * 7",
    "0 0 * * 0", "5 4 * * SUN", "0 22 * * 1-5", "0 0 1 */3 *", "30 23 28-31 * *",
    "0 8-18/2 * * *", "0 0 13 * 5", "20 2 8 3 *", "20 1 1 11 *", "0 2 * 3,10,4 0",
    # wildcard minute or hour: real time
    "* * * * *", "*/15 * * * *", "*/7 * * * *", "0 * * * *", "30 * * * *", "45 * * * 0",
    "0 */2 * * *", "0 */3 * * *", "*/30 1-3 * * *", "*/15 2,3 * * *", "*/10 9-17 * * 1-5",
    "*/5 * 1 * *", "0 * * * 6,0", "15,45 * * * *", "* 2 * * *", "*/20 1 * * *", "*/45 * * * *",
    # six fields (seconds first): always real time
    "0 30 2 * * *", "*/30 * * * * *", "0 0 * * * *", "15 */10 * * * *", "0 0 2 * * *",
    "0 0 0 * * 1-5",
]
TIMEZONES = ["UTC", "America/New_York", "Europe/Berlin", "Australia/Sydney", "America/Santiago",
             "Asia/Kolkata"]
FIRES_PER_CASE = 8
# Sparse schedules start half a day before each 2026 DST change of their zone (and, in zones
# without one, at two ordinary dates); dense ones (a fire every few minutes) start 80, 20 and
# 4 minutes before it, so that their eight fires reach into the gap or the repeated hour.
ORDINARY_STARTS = [datetime(2026, 3, 7, 12, tzinfo=timezone.utc), datetime(2026, 10, 24, 12, tzinfo=timezone.utc)]
DENSE_LEADS_MIN = [80, 20, 4]


def transitions(tz: str) -> list[datetime]:
    """The instants in 2026 at which `tz` changes its UTC offset, to the minute."""
    zone, found = ZoneInfo(tz), []
    t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    while t.year == 2026:
        step = t + timedelta(hours=1)
        if t.astimezone(zone).utcoffset() != step.astimezone(zone).utcoffset():
            low, high = t, step
            while high - low > timedelta(minutes=1):
                mid = low + (high - low) / 2
                if mid.astimezone(zone).utcoffset() == low.astimezone(zone).utcoffset():
                    low = mid
                else:
                    high = mid
            found.append(high.replace(second=0, microsecond=0))
        t = step
    return found


def fmt(dt: datetime) -> str:
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def dense(expr: str) -> bool:
    fields = expr.split()
    minute, hour = (fields[1], fields[2]) if len(fields) == 6 else (fields[0], fields[1])
    return hour.startswith("*") or len(fields) == 6 or minute.startswith("*")


def starts(expr: str, tz: str) -> list[datetime]:
    changes = transitions(tz)
    if not changes:
        return ORDINARY_STARTS
    if dense(expr):
        return [c - timedelta(minutes=lead) for c in changes for lead in DENSE_LEADS_MIN]
    return [c - timedelta(hours=12) for c in changes]


def fixed_time(expr: str) -> bool:
    """Debian cron's rule: a 5-field job whose minute and hour do not start with `*`."""
    fields = expr.split()
    return len(fields) == 5 and not fields[0].startswith("*") and not fields[1].startswith("*")


def brute_force(expr: str, tz: str, after: datetime, count: int) -> list[str]:
    """Real-time fires found by testing every second: a cross-check of cronsim's real-time mode.

    Only the field sets come from cronsim's parser; the walk is independent of its search.
    """
    spec, zone, fires = cronsim.CronSim(expr, after), ZoneInfo(tz), []
    weekdays = {d % 7 for d in spec.weekdays}
    t = after.replace(microsecond=0) + timedelta(seconds=1)
    while len(fires) < count:
        local = t.astimezone(zone)
        day_ok = (local.day in spec.days, (local.isoweekday() % 7) in weekdays)
        if (local.month in spec.months and (all(day_ok) if spec.day_and else any(day_ok))
                and local.hour in spec.hours and local.minute in spec.minutes):
            fires += [fmt(t.replace(second=s)) for s in sorted(spec.seconds) if s >= t.second][:count - len(fires)]
        t = (t + timedelta(minutes=1)).replace(second=0)
    return fires


def main() -> None:
    cases = []
    for expr in EXPRESSIONS:
        for tz in TIMEZONES:
            for after in starts(expr, tz):
                it = cronsim.CronSim(expr, after.astimezone(ZoneInfo(tz)))
                fires = [fmt(next(it)) for _ in range(FIRES_PER_CASE)]
                if not fixed_time(expr) and (checked := brute_force(expr, tz, after, FIRES_PER_CASE)) != fires:
                    raise SystemExit(f"cronsim and the brute-force walk differ: {expr!r} {tz} {fmt(after)}\n"
                                     f"  cronsim {fires}\n  brute   {checked}")
                cases.append({"expr": expr, "timezone": tz, "after": fmt(after), "next": fires})
    table = {"generator": "storage/tests/data/gen_cron_next_fires.py with cronsim " + version("cronsim"),
             "cases": cases}
    with open(__file__.replace("gen_cron_next_fires.py", "cron_next_fires.json"), "w") as out:
        json.dump(table, out, indent=0)
        out.write("\n")
    print(f"{len(EXPRESSIONS)} expressions, {len(cases)} cases")


if __name__ == "__main__":
    main()
