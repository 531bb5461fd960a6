"""asyncio support: waiting for a client's batch results on its completion fd (`Client.fileno()`), which is
readable exactly while results wait to be taken. `Client.completions()` returns `completions(client)`."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, List, Optional

if TYPE_CHECKING:
    from ._native import Client, Completion


async def completions(client: "Client", max: Optional[int] = None) -> List["Completion"]:
    """The next results of `client`'s submitted operations: at least one, at most `max` (all that wait, by
    default). Waits in the running loop through `loop.add_reader` on the completion fd, so the loop goes on
    with other work meanwhile. One awaiter per client at a time (the fd has one reader slot in the loop)."""
    loop = asyncio.get_running_loop()
    fd = client.fileno()
    while True:
        got = client.poll(max)
        if got:
            return got
        ready = loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(fd, wake)
        try:
            # A result may have come between the poll and add_reader: the fd is level-triggered, so the reader
            # fires at once then.
            await ready
        finally:
            loop.remove_reader(fd)

