"""`IdleWork` (llmgw/gateway/idle.py): a request's leftover work waits for a moment when every task is blocked, is
done at once when asked (`settle`) or when nothing runs the queue, and never piles up past its limit."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from llmgw.gateway.idle import IdleWork


async def test_work_waits_while_a_task_can_run_and_is_done_once_every_task_is_blocked() -> None:
    idle = IdleWork()
    done: list[str] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(idle.run)
        idle.defer(lambda: done.append("record"))
        for step in range(20):  # a busy task: twenty steps, each one a checkpoint, never blocked
            await trio.lowlevel.checkpoint()
            assert done == [], f"done while a task could still run (step {step})"
        await trio.sleep(0.001)  # now every task waits
        assert done == ["record"]
        nursery.cancel_scope.cancel()


async def test_settle_does_what_waits_at_once_in_order() -> None:
    idle = IdleWork()
    done: list[int] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(idle.run)
        for n in range(3):
            idle.defer(lambda n=n: done.append(n))
        assert len(idle) == 3 and done == []
        idle.settle()
        assert done == [0, 1, 2] and len(idle) == 0
        nursery.cancel_scope.cancel()


async def test_with_nothing_running_the_queue_work_is_done_at_once() -> None:
    idle = IdleWork()
    done: list[str] = []
    idle.defer(lambda: done.append("now"))
    assert done == ["now"]


async def test_a_full_queue_does_the_next_piece_where_it_is_asked_after_the_waiting_ones() -> None:
    idle = IdleWork(limit=2)
    done: list[int] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(idle.run)
        idle.defer(lambda: done.append(1))
        idle.defer(lambda: done.append(2))
        assert done == []
        idle.defer(lambda: done.append(3))  # full: everything now, oldest first
        assert done == [1, 2, 3] and len(idle) == 0
        nursery.cancel_scope.cancel()


async def test_a_failing_piece_is_logged_and_the_others_are_done(caplog: pytest.LogCaptureFixture) -> None:
    idle = IdleWork()
    done: list[str] = []

    def fails() -> None:
        raise ValueError("a broken record")

    async with trio.open_nursery() as nursery:
        await nursery.start(idle.run)
        idle.defer(fails)
        idle.defer(lambda: done.append("after"))
        with caplog.at_level(logging.ERROR, logger="llmgw.gateway.idle"):
            await trio.testing.wait_all_tasks_blocked()
            await trio.sleep(0.001)
        assert done == ["after"]
        assert "work left by a request failed" in caplog.text and "a broken record" in caplog.text
        nursery.cancel_scope.cancel()


async def test_what_is_left_when_the_runner_stops_is_done_on_its_way_out() -> None:
    idle = IdleWork()
    done: list[str] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(idle.run)
        idle.defer(lambda: done.append("left"))
        nursery.cancel_scope.cancel()  # before the loop ever idles
    assert done == ["left"]
    idle.defer(lambda: done.append("later"))  # stopped: at once again
    assert done == ["left", "later"]
