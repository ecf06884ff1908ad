"""The lease as a context manager: released on exit, whatever happens in the block."""

from .outcomes import Outcome, outcome_for_exception, outcome_for_response

# Outcome -> the name a release takes, for members and names alike (a member, a str, hashes and
# compares as its value): `Outcome(x)` and `.value` run Python-level enum code, ~1 us a pair.
_NAMES = {o.value: o.value for o in Outcome}

class ManagedLease:
    """What `Pool.lease(...)` returns; `with`/`async with` it to get itself back, leased."""

    def __init__(self, pool, key=None, site=None, sub_pool=None):
        self._pool = pool
        self._ticket = (key, site, sub_pool)
        self._lease = None
        self._outcome = None
        self._latency = None
        self._retry_after = None

    @property
    def address(self):
        """The proxy URL to send the work through."""
        return self._lease.address

    @property
    def lease(self):
        """The underlying `Lease`."""
        return self._lease

    def report(self, outcome, latency=None, retry_after=None):
        """Sets the outcome the exit releases with (unless an exception escapes the block)."""
        try:
            self._outcome = _NAMES[outcome]
        except (KeyError, TypeError):
            raise ValueError(f"{outcome!r} is not a valid Outcome") from None
        self._latency = latency
        self._retry_after = retry_after

    def observe(self, response, text=None):
        """Sets the outcome from an HTTP response (see `outcome_for_response`); its latency
        from the response's `elapsed` where the client measures it."""
        outcome, retry_after = outcome_for_response(response, text=text)
        elapsed = getattr(response, "elapsed", None)
        latency = elapsed.total_seconds() if hasattr(elapsed, "total_seconds") else None
        self.report(outcome, latency if outcome is Outcome.SUCCESS else None, retry_after)
        return outcome

    def _release_args(self, exc):
        if exc is not None:
            return (outcome_for_exception(exc).value, None, None)
        if self._outcome is None:
            return ("success", None, None)
        return (self._outcome, self._latency, self._retry_after)

    def __enter__(self):
        self._lease = self._pool.acquire(*self._ticket)
        return self

    def __exit__(self, exc_type, exc, tb):
        self._lease.release(*self._release_args(exc))
        return False

    async def __aenter__(self):
        self._lease = await self._pool.acquire_async(*self._ticket)
        return self

    def __aexit__(self, exc_type, exc, tb):
        # The release's own awaitable, no coroutine around it: its value, None, lets an
        # exception through as False would.
        return self._lease.release_async(*self._release_args(exc))
