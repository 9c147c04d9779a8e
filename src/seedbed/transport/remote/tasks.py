"""What is left on an asyncio loop, ended before the loop closes (the actor's client and the
gateway both close loops of their own)."""

from __future__ import annotations

import asyncio


async def end_tasks(wait_s: float) -> None:
    """Let every other task on this loop end within ``wait_s``, then cancel the rest and wait
    for them to unwind, as ``asyncio.run`` does at its end.

    gRPC leaves a task per call that ends when its core reports the call over: cancelled at
    once, that report would still come after the loop is closed, and another loop would print
    "Event loop is closed" for it. A task still pending when its loop closes prints "Task was
    destroyed but it is pending!", with a traceback, into the run's output.
    """
    tasks = asyncio.all_tasks() - {asyncio.current_task()}
    if not tasks:
        return
    _, late = await asyncio.wait(tasks, timeout=wait_s)
    for task in late:
        task.cancel()
    if late:
        await asyncio.wait(late)
