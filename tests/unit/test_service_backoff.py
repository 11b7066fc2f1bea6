"""The built-in supervisor's wait before starting a role again (`restart_delay`): by example, and as
properties (never past the bound, never shorter after another quick exit, back to the first after a
stable run)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llmgw.domain.timeouts import TIMEOUTS
from llmgw.service.supervisor import restart_delay

T = TIMEOUTS


def test_quick_exits_wait_longer_each_time_up_to_the_bound() -> None:
    waits, in_row = [], 0
    for _ in range(9):
        delay, in_row = restart_delay(in_row, 0.5)
        waits.append(delay)
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60]


def test_a_stable_run_starts_the_count_over() -> None:
    assert restart_delay(7, T.service_stable_s) == (T.service_restart_first_s, 1)
    assert restart_delay(7, T.service_stable_s - 0.1) == (T.service_restart_max_s, 8)


@given(st.integers(min_value=0, max_value=10_000), st.floats(min_value=0, max_value=1e6))
def test_the_wait_is_bounded_and_never_shorter_after_another_quick_exit(in_row: int, ran_s: float) -> None:
    delay, after = restart_delay(in_row, ran_s)
    assert T.service_restart_first_s <= delay <= T.service_restart_max_s
    if ran_s < T.service_stable_s:
        assert after == in_row + 1
        assert restart_delay(after, ran_s)[0] >= delay
    else:
        assert (delay, after) == (T.service_restart_first_s, 1)
