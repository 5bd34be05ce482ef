"""``cancel_and_wait`` stops a task that loses a cancel, as a Redis call under Python 3.11's ``wait_for`` can."""

from __future__ import annotations

import asyncio

import pytest

from kvstate.task_stop import cancel_and_wait


async def test_a_task_that_loses_its_first_cancel_is_stopped() -> None:
    lost = asyncio.Event()

    async def loop_that_loses_a_cancel() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            lost.set()  # what wait_for did on 3.11 when the cancel met the command's reply: carried on
        while True:
            await asyncio.sleep(30)

    task = asyncio.create_task(loop_that_loses_a_cancel())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task), timeout=5.0)
    assert lost.is_set() and task.cancelled()


async def test_what_the_task_raised_is_raised() -> None:
    async def fails_on_cancel() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    task = asyncio.create_task(fails_on_cancel())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="cleanup failed"):
        await cancel_and_wait(task)
