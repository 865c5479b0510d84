"""asyncio without a thread or a timer: await a transport's completions, arrival notices or
peer events on its event fds.

    import kvx.aio
    result = await kvx.aio.poll_async(transport)          # PollResult(done, failed)
    notices = await kvx.aio.notices_async(transport)      # tuple of kvx.Notice
    events = await kvx.aio.peer_events_async(transport)   # list of dicts, as poll_peer_events()

Each awaiter watches the event fd of its own kind (kvx_transport_event_fd_ex, add_reader): the
completions fd is readable while poll() has something, the notices fd while poll_notices() has,
the peer events fd while poll_peer_events() has. So the loop sleeps in its own selector while
nothing of that kind happens, whatever waits of the other kinds undrained, and wakes when the
progress thread (num_threads > 0) queues something. These awaiters drain what they return; one
task per transport and kind should await them (two tasks racing for the same completions each
get a part).
"""

import asyncio
from typing import Optional

from .metrics import EVENT_COMPLETIONS, EVENT_NOTICES, EVENT_PEER_EVENTS, event_fd


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


async def _until(take, transport, timeout: Optional[float], kinds: int):
    fd = event_fd(transport, kinds)
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
    return await _until(lambda: _nonempty(transport.poll()), transport, timeout,
                        EVENT_COMPLETIONS) or transport.poll()


async def notices_async(transport, timeout: Optional[float] = None) -> tuple:
    """Wait until an arrival notice is queued, then return transport.poll_notices()."""
    return await _until(transport.poll_notices, transport, timeout, EVENT_NOTICES) or ()


async def peer_events_async(transport, timeout: Optional[float] = None) -> list:
    """Wait until a peer paired by address has an event (down, restarted, reconnected), then
    return transport.poll_peer_events()."""
    return await _until(transport.poll_peer_events, transport, timeout, EVENT_PEER_EVENTS) or []


def _nonempty(r):
    return r if (r.done or r.failed) else None
