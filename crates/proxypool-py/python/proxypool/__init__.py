"""A pool of outbound proxy addresses behind acquire and release.

The proxypool engine (Rust) in process: state in memory, or shared with every other process
(Python, Node, Rust, the proxypool server) that uses the same Redis server and pool name.

    pool = Pool(["http://10.0.0.1:3128", "http://10.0.0.2:3128"])
    with pool.lease(key="account-7", site="shop.example") as lease:
        r = httpx.get(url, proxy=lease.address)
        lease.observe(r)        # 403 -> blocked, 429 -> rate_limited, captcha -> captcha
"""

import multiprocessing.util as _mp_util
import os as _os
import weakref as _weakref

from . import _native
from ._native import (
    BoundAddressBusy,
    BoundAddressCooling,
    Call,
    DuplicateAddress,
    InvalidAddress,
    InvalidConfig,
    Lease,
    LeaseReleased,
    NoAddressAvailable,
    PoolForked,
    ProxyPoolError,
    SessionBroken,
    StoreUnavailable,
    UnknownAddress,
    UnknownSubPool,
)
from .managed import ManagedLease
from .outcomes import (
    CAPTCHA_MARKERS,
    Outcome,
    outcome_for_exception,
    outcome_for_response,
)

# A forked child rebuilds the runtime and reconnects Redis pools instead of waiting on the
# parent's threads, which do not exist there.
_os.register_at_fork(after_in_child=_native.after_fork_in_child)

# Pools of this process, settled at its exit (those in Redis): a lease dropped inside a
# coroutine only queues its abandon, and a process that exits before the next batch would
# leave the slot taken until the lease TTL.
_pools = _weakref.WeakSet()


def _settle_at_exit():
    for pool in list(_pools):
        pool._settle_at_exit()
    # Theirs, and those of pools dropped before.
    _native.wait_for_settles()


def _register_exit_hook(_=None):
    # multiprocessing's exit function runs it: at the interpreter's exit (atexit), and at the
    # end of a worker, just before its os._exit (which runs no atexit hook).
    _mp_util.Finalize(None, _settle_at_exit, exitpriority=100)


class _Registration:
    """Kept alive here: multiprocessing's after-fork registry holds it weakly."""


_registration = _Registration()
_register_exit_hook()
# A finalizer runs only in the process that made it: made again in a forked child, and again
# in a multiprocessing worker, which empties its finalizers when it starts, then runs these.
_os.register_at_fork(after_in_child=_register_exit_hook)
_mp_util.register_after_fork(_registration, _register_exit_hook)


class Pool(_native.Pool):
    """Pool(addresses, *, redis=None, name="default", sub_pools=None, seed=None,
    redis_timeout=0.5, **tunables)

    `addresses`: proxy URLs, or (URL, [sub_pool, ...]) pairs. `redis`: "redis://host:port/db"
    (or "redis+cluster://host:port,host:port,..." for a Redis Cluster) to share the pool with
    every process using the same `name`. `sub_pools`: {name: strategy}.
    `tunables`: fields of the engine's configuration (strategy="round_robin", sticky_ttl=600,
    max_leases_per_address=4, health={"window": 20}, ...); durations are seconds.
    """

    def __init__(self, *args, **kwargs):
        # Built by the native constructor, which took the same arguments.
        _pools.add(self)

    def lease(self, key=None, site=None, sub_pool=None):
        """A context manager (`with` and `async with`) that acquires on entry and releases on
        exit: with the outcome set by `observe`/`report`, else success; an exception is
        reported as the outcome `outcome_for_exception` maps it to, then re-raised."""
        return ManagedLease(self, key, site, sub_pool)


__all__ = [
    "BoundAddressBusy",
    "BoundAddressCooling",
    "CAPTCHA_MARKERS",
    "Call",
    "DuplicateAddress",
    "InvalidAddress",
    "InvalidConfig",
    "Lease",
    "LeaseReleased",
    "ManagedLease",
    "NoAddressAvailable",
    "Outcome",
    "Pool",
    "PoolForked",
    "ProxyPoolError",
    "SessionBroken",
    "StoreUnavailable",
    "UnknownAddress",
    "UnknownSubPool",
    "outcome_for_exception",
    "outcome_for_response",
]
