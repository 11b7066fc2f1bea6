"""Schedules (domain/schedule.py): the cron parser by example and by property, and which rule rules when."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.domain import schedule
from llmgw.domain.schedule import Cron, CronError, Rule, ruling, zone, zone_problem

UTC = dt.timezone.utc
BERLIN = "Europe/Berlin"


def at(text: str, tz: str = "UTC") -> float:
    """Unix seconds of a wall time "YYYY-MM-DD HH:MM" in zone `tz`."""
    return dt.datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=zone(tz)).timestamp()


def wall(t: float, tz: str = "UTC") -> str:
    return dt.datetime.fromtimestamp(t, zone(tz)).strftime("%Y-%m-%d %H:%M %a")


# --- parsing by example ------------------------------------------------------------------------------------------


def test_fields_read_as_cron_reads_them():
    c = Cron.parse("*/15 8-18/2 1,15 jan-mar mon-fri")
    assert c.minutes == (0, 15, 30, 45)
    assert c.hours == (8, 10, 12, 14, 16, 18)
    assert c.days == {1, 15} and c.months == {1, 2, 3}
    assert c.weekdays == {0, 1, 2, 3, 4}  # Monday..Friday as date.weekday()
    assert Cron.parse("0 0 * * 0").weekdays == Cron.parse("0 0 * * 7").weekdays == Cron.parse("0 0 * * SUN").weekdays
    assert Cron.parse("5/20 * * * *").minutes == (5, 25, 45)  # `a/n`: from a, every n


@pytest.mark.parametrize(("text", "words"), [
    ("0 8 * *", "has 4 fields"),
    ("0 8 * * * *", "has 6 fields"),
    ("60 * * * *", "minute: '60' is not a value from 0 to 59"),
    ("* 24 * * *", "hour: '24' is not a value from 0 to 23"),
    ("* * 0 * *", "day of month: '0' is not a value from 1 to 31"),
    ("* * * 13 *", "month: '13' is not a value from 1 to 12 or jan-dec"),
    ("* * * * 8", "day of week: '8' is not a value from 0 to 7 or sun-sat"),
    ("* * * * funday", "day of week: 'funday'"),
    ("*/0 * * * *", "minute: '*/0' has a bad step"),
    ("10-5 * * * *", "the range '10-5' runs backwards"),
    ("0 0 30 2 *", "never matches"),
    ("0 0 31 4,6 *", "never matches"),
    ("", "has 0 fields"),
    ("1,,2 * * * *", "minute: '' is not a value"),
])
def test_a_bad_cron_is_refused_with_the_field_and_why(text, words):
    with pytest.raises(CronError, match=None) as e:
        Cron.parse(text)
    assert words in str(e.value)


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.text(max_size=40), st.lists(st.text("0123456789*/-,²١abcjanmonsun", max_size=8), min_size=5,
                                                 max_size=5).map(" ".join)))
def test_any_text_parses_or_is_refused_with_a_cron_error(text):
    try:
        Cron.parse(text)
    except CronError:
        pass


def test_unicode_digits_are_not_numbers():
    for text in ("² * * * *", "*/² * * * *", "١ * * * *"):
        with pytest.raises(CronError):
            Cron.parse(text)


def test_either_day_field_matches_when_both_are_restricted():
    c = Cron.parse("0 0 13 * fri")  # the 13th, and every Friday (cron's rule), not only Friday the 13th
    assert c.matches_day(dt.date(2026, 12, 13))  # a Sunday
    assert c.matches_day(dt.date(2026, 12, 11))  # a Friday
    assert not c.matches_day(dt.date(2026, 12, 12))
    only_fridays = Cron.parse("0 0 * * fri")
    assert not only_fridays.matches_day(dt.date(2026, 12, 13))


def test_next_and_last_by_example():
    c = Cron.parse("0 8 * * mon-fri")
    sat = at("2026-12-05 12:00")
    assert wall(c.next_at(sat, UTC)) == "2026-12-07 08:00 Mon"
    assert wall(c.last_at(sat, UTC)) == "2026-12-04 08:00 Fri"
    exactly = at("2026-12-07 08:00")
    assert c.next_at(exactly, UTC) == exactly == c.last_at(exactly, UTC)  # at the instant itself: both
    leap = Cron.parse("0 0 29 2 *")
    assert wall(leap.next_at(at("2025-03-01 00:00"), UTC)) == "2028-02-29 00:00 Tue"


def test_a_cron_whose_days_are_years_apart_finds_its_next_and_last():
    """A day field starting with `*` makes a day match both fields: its days can be decades apart. Hypothesis found
    `* * 1 1 */7` (1 January, a Sunday) raising "matches no time" after 2023's, the next being 2034's."""
    new_year_sunday = Cron.parse("* * 1 1 */7")
    assert wall(new_year_sunday.next_at(at("2023-01-01 23:59") + 1e-3, UTC)) == "2034-01-01 00:00 Sun"
    assert wall(new_year_sunday.last_at(at("2033-12-31 23:59"), UTC)) == "2023-01-01 23:59 Sun"
    leap_sunday = Cron.parse("0 0 29 2 */7")  # 2100 is no leap year: 2088's, then 2128's
    assert wall(leap_sunday.next_at(at("2088-02-29 00:01"), UTC)) == "2128-02-29 00:00 Sun"
    assert wall(leap_sunday.last_at(at("2128-02-28 00:00"), UTC)) == "2088-02-29 00:00 Sun"


def test_clock_changes_in_a_zone():
    tz = zone(BERLIN)
    # 29 March 2026: clocks go from 02:00 to 03:00. 02:30 does not exist: it happens at 03:30 (old offset).
    skipped = Cron.parse("30 2 * * *")
    assert wall(skipped.next_at(at("2026-03-29 00:00", BERLIN), tz), BERLIN) == "2026-03-29 03:30 Sun"
    # 25 October 2026: 02:00-03:00 happens twice; 02:30 matches its first occurrence only.
    twice = Cron.parse("30 2 * * *")
    first = twice.next_at(at("2026-10-25 00:00", BERLIN), tz)
    assert first == dt.datetime(2026, 10, 25, 0, 30, tzinfo=UTC).timestamp()  # 02:30 CEST
    assert wall(twice.next_at(first + 1, tz), BERLIN) == "2026-10-26 02:30 Mon"
    # Office hours keep their wall time across the change: 08:00 is 07:00 UTC in winter, 06:00 in summer.
    office = Cron.parse("0 8 * * *")
    assert dt.datetime.fromtimestamp(office.next_at(at("2026-03-28 12:00", BERLIN), tz), UTC).hour == 6
    assert dt.datetime.fromtimestamp(office.last_at(at("2026-03-28 12:00", BERLIN), tz), UTC).hour == 7


def test_unknown_zones_are_refused():
    assert zone_problem("UTC") is None and zone_problem(BERLIN) is None
    assert "not a time zone" in (zone_problem("Mars/Olympus") or "")
    assert "not a time zone" in (zone_problem("../etc/passwd") or "")
    assert "IANA" in (zone_problem(7) or "")


# --- properties --------------------------------------------------------------------------------------------------

def _field(low: int, high: int) -> st.SearchStrategy[str]:
    one = st.integers(low, high).map(str)
    span = st.tuples(st.integers(low, high), st.integers(low, high)).map(lambda ab: f"{min(ab)}-{max(ab)}")
    step = st.tuples(st.sampled_from(["*", f"{low}-{high}"]), st.integers(1, high - low + 1)).map(
        lambda sn: f"{sn[0]}/{sn[1]}")
    item = st.one_of(st.just("*"), one, span, step)
    return st.lists(item, min_size=1, max_size=3).map(",".join)


CRONS = st.tuples(_field(0, 59), _field(0, 23), _field(1, 28), _field(1, 12), _field(0, 7)).map(" ".join)
INSTANTS = st.integers(int(at("2024-01-01 00:00")), int(at("2030-01-01 00:00"))).map(float)
ZONES = st.sampled_from(["UTC", BERLIN, "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"])


@settings(max_examples=80, deadline=None)
@given(CRONS, INSTANTS, ZONES)
def test_next_match_is_at_or_after_now_matches_and_none_is_skipped(text, t, tz_name):
    cron, tz = Cron.parse(text), zone(tz_name)
    found = cron.next_at(t, tz)
    assert found >= t
    local = dt.datetime.fromtimestamp(found, tz)
    # It matches as a wall time, or it is a skipped wall time moved forward by a clock change.
    assert cron.matches(local) or cron.matches(local - (local.dst() or dt.timedelta()))
    # No match in between: every minute from t up to it does not match (checked over the first 3 hours).
    minute = (int(t) + 59) // 60 * 60
    while minute < min(found, t + 3 * 3600):
        here = dt.datetime.fromtimestamp(minute, tz)
        assert not (cron.matches(here) and here.fold == 0 and
                    dt.datetime(*here.timetuple()[:6], tzinfo=tz).timestamp() == minute), wall(minute, tz_name)
        minute += 60


@settings(max_examples=80, deadline=None)
@given(CRONS, INSTANTS, ZONES)
def test_last_match_is_at_or_before_now_and_next_after_it_is_not_before_now(text, t, tz_name):
    cron, tz = Cron.parse(text), zone(tz_name)
    last = cron.last_at(t, tz)
    assert last is not None and last <= t
    assert cron.next_at(last, tz) == last  # it is a match
    assert cron.next_at(last + 1e-3, tz) > t or cron.next_at(last + 1e-3, tz) == t  # none between it and t


@settings(max_examples=100, deadline=None)
@given(CRONS)
def test_parsing_is_stable(text):
    c = Cron.parse(text)
    assert Cron.parse(c.text) == c
    assert all(0 <= m <= 59 for m in c.minutes) and all(0 <= h <= 23 for h in c.hours)


# --- which rule rules --------------------------------------------------------------------------------------------

OFFICE = Rule("0 8 * * mon-fri", 2, 4, end="0 18 * * mon-fri")
LUNCH = Rule("0 12 * * *", 5, 6, duration_s=2 * 3600)
NIGHT = Rule("0 22 * * *", 0, 0, duration_s=8 * 3600)


@pytest.mark.parametrize(("when", "rule", "bounds", "next_change"), [
    ("2026-12-07 07:59", None, (1, 1), "2026-12-07 08:00 Mon"),  # Monday before office hours: the model's own
    ("2026-12-07 08:00", 0, (2, 4), "2026-12-07 12:00 Mon"),
    ("2026-12-07 12:30", 1, (5, 6), "2026-12-07 14:00 Mon"),  # lunch began last: it rules inside office hours
    ("2026-12-07 14:00", 0, (2, 4), "2026-12-07 18:00 Mon"),  # and office hours resume after it
    ("2026-12-07 18:00", None, (1, 1), "2026-12-07 22:00 Mon"),
    ("2026-12-08 03:00", 2, (0, 0), "2026-12-08 06:00 Tue"),
    ("2026-12-05 12:30", 1, (5, 6), "2026-12-05 14:00 Sat"),  # a Saturday: no office hours
])
def test_the_rule_that_began_most_recently_rules(when, rule, bounds, next_change):
    rules = (OFFICE, LUNCH, NIGHT)
    r = ruling(rules, 1, 1, at(when, BERLIN), BERLIN)
    assert (r.rule, (r.min, r.max)) == (rule, bounds)
    assert wall(r.next_change or 0, BERLIN) == next_change
    if rule is not None:
        assert r.since is not None and r.since <= at(when, BERLIN) < (r.until or 0)
    assert "Europe/Berlin" in r.words(rules)


def test_a_tie_goes_to_the_rule_listed_later():
    a, b = Rule("0 8 * * *", 1, 1, duration_s=3600), Rule("0 8 * * *", 3, 3, duration_s=600)
    assert ruling((a, b), 0, 0, at("2026-12-07 08:05"), "UTC").rule == 1
    assert ruling((a, b), 0, 0, at("2026-12-07 08:15"), "UTC").rule == 0  # b has ended; a still rules
    assert ruling((b, a), 0, 0, at("2026-12-07 08:05"), "UTC").rule == 1


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(CRONS, st.integers(1, 48 * 60)), min_size=1, max_size=3), INSTANTS)
def test_ruling_is_a_rule_in_force_that_began_last(specs, t):
    rules = tuple(Rule(c, i, i, duration_s=minutes * 60.0) for i, (c, minutes) in enumerate(specs))
    r = ruling(rules, 99, 99, t, "UTC")
    windows = [rule.window(t, UTC) for rule in rules]
    in_force = [(w[0], i) for i, w in enumerate(windows) if w is not None]
    if not in_force:
        assert (r.rule, r.min) == (None, 99)
    else:
        assert r.rule == max(in_force)[1] and r.min == r.rule
    assert r.next_change is not None and r.next_change > t


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(CRONS, st.integers(1, 6 * 60)), min_size=1, max_size=3), INSTANTS,
       st.lists(st.integers(1, 3 * 3600), min_size=1, max_size=12), ZONES)
def test_the_remembered_answer_is_the_one_computed_afresh(specs, t, steps, tz_name):
    """`ruling` keeps its last answer until that answer's next change: a pass each second finds the same."""
    rules = tuple(Rule(c, i, i, duration_s=minutes * 60.0) for i, (c, minutes) in enumerate(specs))
    for step in steps:
        t += step
        assert ruling(rules, 9, 9, t, tz_name) == schedule._ruling(rules, 9, 9, t, tz_name)
