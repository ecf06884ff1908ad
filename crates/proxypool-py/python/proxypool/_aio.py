"""One completion bridge per asyncio loop (see the Rust module `aio`)."""

import weakref

from . import _native

_bridges = weakref.WeakKeyDictionary()


def bridge(loop):
    """The loop's bridge, registered as a reader on first use (of its own socket and, where
    the loop drives the runtime, of the runtime's epoll); kept as an attribute of the loop
    where it takes one (a single lookup per call), else in a weak mapping."""
    b = _bridges.get(loop)
    if b is None:
        b = _native.Completions()
        # The callback is told its loop: the calls its tasks make need not look it up.
        loop.add_reader(b.fileno(), b.drive, loop)
        fd = _native.runtime_fd()
        if fd is not None:
            loop.add_reader(fd, b.drive, loop)
        try:
            loop._proxypool_bridge = b
        except AttributeError:
            _bridges[loop] = b
    return b
