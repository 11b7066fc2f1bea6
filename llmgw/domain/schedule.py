"""Schedules (S3): 5-field cron expressions in the cluster's time zone, and which of a model's schedule rules
sets its replicas.min/max at an instant. Pure: time arrives as unix seconds; zones are read with `zoneinfo`.

A rule starts at each match of its `start` cron and rules until `duration_s` later or the next match of its
`end` cron. While one rules, its min/max replace the model's own `replicas.min/max` (max may be 0: the model
is off then, even when asked for); outside every rule the model's own apply. Rules that overlap: the one that
began most recently rules (a tie: the one listed later), so a short exception inside a long window wins while it
lasts and the window resumes after it.

Cron, as Vixie cron reads it: minute (0-59), hour (0-23), day of month (1-31), month (1-12 or jan-dec), day of
week (0-7 or sun-sat; 0 and 7 are Sunday); each field `*`, a number, a range `a-b`, a step `*/n` or `a-b/n` or
`a/n`, or a list of those joined by `,`. When both day fields are restricted (neither starts with `*`), a day
matches when either does. Clock changes: a wall time that a change skips (02:30 on the night clocks go from
02:00 to 03:00) happens as the same time on the old offset (03:30 new time); one that occurs twice matches its
first occurrence only.
"""

from __future__ import annotations

import calendar
import datetime as dt
import functools
import re
from dataclasses import dataclass
from typing import Iterator
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["Cron", "CronError", "Ruling", "Rule", "in_force", "ruling", "zone", "zone_problem"]

_FIELDS = (  # name, low, high, names for the values from `low`
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")),
    ("day of week", 0, 7, ("sun", "mon", "tue", "wed", "thu", "fri", "sat")),
)
MAX_CRON_CHARS = 200
_DIGITS = re.compile(r"[0-9]{1,4}")  # ASCII digits only: str.isdigit() takes '²', which int() refuses
# How far a search for a match goes, in days. When a day field starts with `*` a day must match both (cron's
# rule), so "1 January, a Sunday" (`* * 1 1 */7`) matches 11 years apart and "29 February, a Monday" 40 years apart
# across 2100, which is no leap year: 14,609 days, the longest gap between two days of one month, day and weekday in
# the Gregorian calendar's 400-year cycle. A cron that matches no day at all (30 February) is refused when parsed;
# any other matches within this bound, so it only stops a runaway. Only such a cron searches that far.
SEARCH_DAYS = 14_610
LONGEST_RULE = 366 * 86400.0  # seconds, the longest a rule may last (a bound on input, not a wait)
UTC = dt.timezone.utc


class CronError(ValueError):
    """A cron expression that cannot be read; the message says which field and why."""


@dataclass(frozen=True)
class Cron:
    """A parsed cron expression: the sets of values each field matches."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Monday .. 6 = Sunday, as `date.weekday()`
    day_star: bool  # the day-of-month field starts with `*`
    weekday_star: bool

    @classmethod
    def parse(cls, text: str) -> Cron:
        return _parse(text)

    def matches_day(self, day: dt.date) -> bool:
        if day.month not in self.months:
            return False
        by_day, by_weekday = day.day in self.days, day.weekday() in self.weekdays
        if self.day_star or self.weekday_star:
            return by_day and by_weekday
        return by_day or by_weekday

    def matches(self, when: dt.datetime) -> bool:
        """Whether the wall time `when` (its date, hour and minute; seconds aside) matches."""
        return when.minute in self.minutes and when.hour in self.hours and self.matches_day(when.date())

    def next_at(self, t: float, tz: dt.tzinfo) -> float:
        """The first instant at or after `t` (unix seconds) when the cron matches in `tz`."""
        found = _search(self, t, tz, forward=True)
        if found is None:  # only a cron that matches no day, which parsing refuses
            raise CronError(f"{self.text!r} matches no time in {SEARCH_DAYS} days")
        return found

    def last_at(self, t: float, tz: dt.tzinfo) -> float | None:
        """The last instant at or before `t` when the cron matched in `tz`; None when none since `SEARCH_DAYS` days
        before it (a cron whose days are decades apart)."""
        return _search(self, t, tz, forward=False)


def _parse(text: str) -> Cron:
    if not isinstance(text, str) or len(text) > MAX_CRON_CHARS:
        raise CronError(f"must be a cron expression of at most {MAX_CRON_CHARS} characters")
    parts = text.split()
    if len(parts) != 5:
        raise CronError(f"{text!r:.80} has {len(parts)} fields; a cron expression has 5: minute hour "
                        "day-of-month month day-of-week (e.g. \"0 8 * * mon-fri\")")
    sets = [_field(part, *spec) for part, spec in zip(parts, _FIELDS)]
    weekdays = frozenset((d - 1) % 7 for d in sets[4])  # cron 0/7 = Sunday -> 6; 1 = Monday -> 0
    cron = Cron(" ".join(parts), tuple(sorted(sets[0])), tuple(sorted(sets[1])), frozenset(sets[2]),
                frozenset(sets[3]), weekdays, parts[2].startswith("*"), parts[4].startswith("*"))
    if (cron.day_star or cron.weekday_star) and not any(
            d <= _longest_month(m) for m in cron.months for d in cron.days):
        raise CronError(f"{text!r:.80} names a day no month in it has (e.g. 30 February): it never matches")
    return cron


def _longest_month(month: int) -> int:
    return 29 if month == 2 else calendar.monthrange(2001, month)[1]


def _field(part: str, name: str, low: int, high: int, names: tuple[str, ...]) -> set[int]:
    found: set[int] = set()
    for item in part.split(","):
        body, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not _DIGITS.fullmatch(step_text) or not 1 <= int(step_text) <= high - low + 1:
                raise CronError(f"{name}: {item!r:.40} has a bad step (a whole number from 1 to {high - low + 1})")
            step = int(step_text)
        if body == "*":
            first, last = low, high
        elif "-" in body:
            a, _, b = body.partition("-")
            first, last = _value(a, name, low, high, names), _value(b, name, low, high, names)
            if first > last:
                raise CronError(f"{name}: the range {body!r:.40} runs backwards")
        else:
            first = _value(body, name, low, high, names)
            last = high if slash else first  # `a/n`: from a to the end, every n
        found.update(range(first, last + 1, step))
    return found


def _value(text: str, name: str, low: int, high: int, names: tuple[str, ...]) -> int:
    if text.lower() in names:
        return low + names.index(text.lower())
    if not _DIGITS.fullmatch(text) or not low <= int(text) <= high:
        named = f" or {names[0]}-{names[-1]}" if names else ""
        raise CronError(f"{name}: {text!r:.40} is not a value from {low} to {high}{named}")
    return int(text)


# --- searching in a time zone -------------------------------------------------------------------------------


def _instants(cron: Cron, day: dt.date, tz: dt.tzinfo) -> Iterator[float]:
    """The instants of `day` (a wall date in `tz`) that the cron matches, in wall-time order. On a day without
    a clock change that is also time order."""
    if not _changes_on(day, tz):  # one offset all day: arithmetic, not a zone lookup per minute
        midnight = dt.datetime(day.year, day.month, day.day, tzinfo=tz).timestamp()
        for hour in cron.hours:
            for minute in cron.minutes:
                yield midnight + hour * 3600 + minute * 60
        return
    for hour in cron.hours:
        for minute in cron.minutes:
            yield dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz).timestamp()


def _changes_on(day: dt.date, tz: dt.tzinfo) -> bool:
    start = dt.datetime(day.year, day.month, day.day, tzinfo=tz)
    end = start + dt.timedelta(days=1)
    return start.utcoffset() != end.utcoffset()


def _search(cron: Cron, t: float, tz: dt.tzinfo, *, forward: bool) -> float | None:
    day = dt.datetime.fromtimestamp(t, tz).date()
    one = dt.timedelta(days=1 if forward else -1)
    # A day whose clock changes may hold an instant of the next or previous wall day: one day's margin.
    day -= one
    for _ in range(SEARCH_DAYS + 2):
        if cron.matches_day(day):
            found = [x for x in _instants(cron, day, tz) if (x >= t if forward else x <= t)]
            if found:
                best = min(found) if forward else max(found)
                if not _changes_on(day, tz) and not _changes_on(day + one, tz):
                    return best
                # Around a clock change the next wall day may hold an earlier (or later) instant.
                other = day + one
                more = [x for x in _instants(cron, other, tz) if (x >= t if forward else x <= t)] \
                    if cron.matches_day(other) else []
                return min([best, *more]) if forward else max([best, *more])
        day += one
    return None


def zone_problem(name: object) -> str | None:
    """Why `name` is not a time zone this machine knows (an IANA name such as Europe/Berlin), or None."""
    if not isinstance(name, str) or not name:
        return "must be an IANA time zone name, such as UTC or Europe/Berlin"
    try:
        zone(name)
    except (ZoneInfoNotFoundError, ValueError):
        return f"{name!r:.60} is not a time zone this machine knows (an IANA name such as UTC or Europe/Berlin)"
    return None


@functools.lru_cache(maxsize=64)
def zone(name: str) -> dt.tzinfo:
    """The time zone named `name` (UTC without a time zone database)."""
    if name == "UTC":
        return UTC
    return ZoneInfo(name)


# --- a model's rules ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One schedule rule of a model: from each match of `start` until `duration_s` later (when set) or the next
    match of `end`, the model's replicas are between `min` and `max`."""

    start: str
    min: int
    max: int
    end: str = ""
    duration_s: float = 0.0  # used when `end` is ""

    def to_doc(self) -> dict[str, object]:
        doc: dict[str, object] = {"start": self.start}
        if self.end:
            doc["end"] = self.end
        else:
            doc["duration_s"] = self.duration_s
        doc.update(min=self.min, max=self.max)
        return doc

    def words(self) -> str:
        until = f"until {self.end}" if self.end else f"for {span_words(self.duration_s)}"
        return f"{self.start} {until}: replicas {self.min}..{self.max}"

    def window(self, t: float, tz: dt.tzinfo) -> tuple[float, float] | None:
        """(began, ends) of the period of this rule in force at `t`, or None when it is not."""
        began = _cron(self.start).last_at(t, tz)
        if began is None:
            return None
        ends = self.ends_after(began, tz)
        return (began, ends) if t < ends else None

    def ends_after(self, began: float, tz: dt.tzinfo) -> float:
        if self.end:
            return _cron(self.end).next_at(began + 60.0, tz)  # the next match after the start's minute
        return began + self.duration_s


@functools.lru_cache(maxsize=1024)
def _cron(text: str) -> Cron:
    return Cron.parse(text)


def span_words(seconds: float) -> str:
    """A duration as a rule says it: "10 h", "90 min", "2 d"."""
    s = int(seconds)
    if s % 86400 == 0:
        return f"{s // 86400} d"
    if s % 3600 == 0:
        return f"{s // 3600} h"
    if s % 60 == 0:
        return f"{s // 60} min"
    return f"{s} s"


@dataclass(frozen=True)
class Ruling:
    """What a model's schedules say at an instant: `rule` (index into its rules) rules with `min`/`max` since
    `since` until `until`; None: no rule, the model's own min/max. `next_change`: when what rules changes
    next (a rule starts or the ruling one ends); None when nothing is due within the search bound. `zone`:
    the time zone's name the rules were read in."""

    rule: int | None
    min: int
    max: int
    since: float | None = None
    until: float | None = None
    next_change: float | None = None
    zone: str = "UTC"

    def words(self, rules: tuple[Rule, ...]) -> str:
        nxt = f"; next change {self.at(self.next_change)}" if self.next_change is not None else ""
        if self.rule is None:
            return f"no rule now (replicas.min/max apply){nxt}"
        return f"rule {self.rule + 1} ({rules[self.rule].words()}) since {self.at(self.since)}{nxt}"

    def at(self, t: float | None) -> str:
        """An instant as the zone's wall time: "2026-12-07 08:00 Europe/Berlin"."""
        if t is None:
            return "-"
        return dt.datetime.fromtimestamp(t, zone(self.zone)).strftime("%Y-%m-%d %H:%M ") + self.zone

    def to_doc(self, rules: tuple[Rule, ...]) -> dict[str, object]:
        return {"rule": self.rule, "min": self.min, "max": self.max, "since": self.since, "until": self.until,
                "next_change": self.next_change, "time_zone": self.zone, "words": self.words(rules)}


def in_force(rules: tuple[Rule, ...], own_min: int, own_max: int, t: float, tz_name: object) -> Ruling | None:
    """`ruling` for a model's rules in the zone the setting `cluster.time_zone` names (`tz_name`; UTC when this
    machine does not know it: a stored zone this member's time zone database lacks); None without rules."""
    if not rules:
        return None
    return ruling(rules, own_min, own_max, t, "UTC" if zone_problem(tz_name) else str(tz_name))


# The last answer per model's rules, with the instant it was computed at: it holds until its `next_change` (no
# rule starts before then, and the ruling one does not end), so a reconciler pass each second searches the
# calendar once a change, not once a pass. The answer is the same with or without it.
_LAST: dict[tuple[tuple[Rule, ...], int, int, str], tuple[float, Ruling]] = {}
_LAST_MAX = 4096


def ruling(rules: tuple[Rule, ...], own_min: int, own_max: int, t: float, tz_name: str) -> Ruling:
    """Which rule sets the replicas at `t` (see the module's docstring), in the zone named `tz_name`."""
    key = (rules, own_min, own_max, tz_name)
    seen = _LAST.get(key)
    if seen is not None and seen[0] <= t and seen[1].next_change is not None and t < seen[1].next_change:
        return seen[1]
    found = _ruling(rules, own_min, own_max, t, tz_name)
    if len(_LAST) >= _LAST_MAX:
        _LAST.clear()
    _LAST[key] = (t, found)
    return found


def _ruling(rules: tuple[Rule, ...], own_min: int, own_max: int, t: float, tz_name: str) -> Ruling:
    tz = zone(tz_name)
    best: tuple[float, int, float] | None = None  # (began, index, ends)
    for i, rule in enumerate(rules):
        found = rule.window(t, tz)
        if found is not None and (best is None or (found[0], i) >= best[:2]):
            best = (found[0], i, found[1])
    # Every start after `t` is a change (the most recent start rules), and so is the end of the ruling one.
    changes = [_cron(r.start).next_at(t + 1e-3, tz) for r in rules]
    if best is None:
        return Ruling(None, own_min, own_max, next_change=min(changes, default=None), zone=tz_name)
    rule = rules[best[1]]
    return Ruling(best[1], rule.min, rule.max, best[0], best[2], min([*changes, best[2]]), tz_name)
