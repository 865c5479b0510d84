"""asyncio without a thread or a timer: await a transport's completions on its event fd.

    import kvx.aio
    result = await kvx.aio.poll_async(transport)          # PollResult(done, failed)
    notices = await kvx.aio.notices_async(transport)      # tuple of kvx.Notice

The loop watches kvx_transport_event_fd (add_reader): it is readable while poll() has
completions, poll_notices() has notices or poll_peer_events() has events, so the loop sleeps in
its own selector while nothing happens, and wakes when the progress thread (num_threads > 0)
queues something. These helpers drain what they return; one task per transport should await
them (two tasks racing for the same completions each get a part).
"""

import asyncio
from typing import Optional

from .metrics import event_fd


async def _readable(fd: int, timeout: Optional[float]) -> bool:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def ready():
        if not fut.done():
            fut.set_result(True)

    loop.add_reader(fd, ready)
    try:
        if timeout is None:
            await fut
            return True
        try:
            await asyncio.wait_for(fut, timeout)
            return True
        except asyncio.TimeoutError:
            return False
    finally:
        loop.remove_reader(fd)


async def _until(take, transport, timeout: Optional[float]):
    fd = event_fd(transport)
    loop = asyncio.get_running_loop()
    end = None if timeout is None else loop.time() + timeout
    while True:
        if transport._closed:  # close() makes the fd readable for good: wake, and say so
            raise RuntimeError("KvxTransport is closed")
        got = take()
        if got:
            return got
        left = None if end is None else end - loop.time()
        if left is not None and left <= 0:
            return got
        await _readable(fd, left)


async def poll_async(transport, timeout: Optional[float] = None):
    """Wait until some transfer of any peer has finished, then return transport.poll()
    (PollResult(done, failed), every peer's). With a timeout (seconds) it may return an empty
    result. RuntimeError once the transport is closed."""
    return await _until(lambda: _nonempty(transport.poll()), transport, timeout) or \
        transport.poll()


async def notices_async(transport, timeout: Optional[float] = None) -> tuple:
    """Wait until an arrival notice is queued, then return transport.poll_notices()."""
    return await _until(transport.poll_notices, transport, timeout) or ()


def _nonempty(r):
    return r if (r.done or r.failed) else None
