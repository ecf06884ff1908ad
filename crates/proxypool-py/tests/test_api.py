"""The API's contract: arguments, typed errors, the snapshot's shape, tunables."""

import asyncio
import contextvars
import pathlib
import re
import socket
import threading
import time

import pytest

import proxypool

A = ["http://10.0.0.1:3128", "http://bob:secret@10.0.0.2:3128", "socks5://10.0.0.3:1080"]


def test_outcome_names_and_latency_defaults():
    pool = proxypool.Pool(A, seed=3)
    for name in ("success", "connect_error", "timeout", "blocked", "captcha"):
        pool.acquire(site="s.example").release(name)
    pool.acquire(site="s.example").release(proxypool.Outcome.SUCCESS, latency=0.25)
    pool.acquire(site="r.example").release("rate_limited", retry_after=3.5)
    lease = pool.acquire()
    with pytest.raises(ValueError, match="unknown outcome"):
        lease.release("fine")
    with pytest.raises(ValueError, match="rate_limited"):
        lease.release("success", retry_after=1)
    with pytest.raises(ValueError, match="latency"):
        lease.release("success", latency=-1)
    assert not lease.released
    lease.release()
    assert lease.released
    with pytest.raises(proxypool.LeaseReleased):
        lease.release()
    totals = [a["totals"] for a in pool.snapshot()["addresses"]]
    assert sum(t["successes"] for t in totals) == 3
    assert sum(t["failures"] for t in totals) == 3
    assert sum(t["captchas"] for t in totals) == 1
    assert sum(t["rate_limited"] for t in totals) == 1


def test_snapshot_is_plain_dicts_shaped_like_the_json_api():
    pool = proxypool.Pool(A, sub_pools={"eu": "round_robin"})
    pool.add("http://10.0.0.9:3128", ["eu"])
    pool.acquire(key="k", site="shop.example").release("success", latency=0.1)
    snap = pool.snapshot()
    assert set(snap) == {"at_ms", "addresses", "matrix", "sites", "pool", "decisions"}
    row = next(a for a in snap["addresses"] if a["address"] == "http://bob:***@10.0.0.2:3128")
    assert row["state"] == "healthy"
    assert "secret" not in repr(snap)
    added = next(a for a in snap["addresses"] if a["address"] == "http://10.0.0.9:3128")
    assert added["sub_pools"] == ["eu"]
    assert pool.acquire(sub_pool="eu").address == "http://10.0.0.9:3128"
    assert snap["pool"]["addresses"] == 4
    # The server's OpenAPI document names the same fields for an address row.
    assert {"address", "state", "weight", "active_leases", "totals"} <= set(row)
    pool.remove("http://10.0.0.9:3128")
    assert len(pool.snapshot()["addresses"]) == 3


def test_typed_errors():
    pool = proxypool.Pool(A)
    with pytest.raises(proxypool.UnknownSubPool):
        pool.acquire(sub_pool="nope")
    with pytest.raises(proxypool.DuplicateAddress):
        pool.add(A[0])
    with pytest.raises(proxypool.UnknownAddress):
        pool.remove("http://10.9.9.9:1")
    with pytest.raises(proxypool.InvalidAddress):
        pool.add("ftp://10.0.0.1:21")
    with pytest.raises(proxypool.NoAddressAvailable):
        proxypool.Pool([]).acquire()
    with pytest.raises(proxypool.InvalidConfig, match="stiky_ttl"):
        proxypool.Pool(A, stiky_ttl=3)
    with pytest.raises(proxypool.InvalidConfig, match="quarantine_cap"):
        proxypool.Pool(A, quarantine_cap=2.0)
    with pytest.raises(proxypool.InvalidConfig, match="seconds"):
        proxypool.Pool(A, sticky_ttl="long")
    with pytest.raises(proxypool.InvalidConfig, match="strategy"):
        proxypool.Pool(A, sub_pools={"eu": "random"})
    with pytest.raises(proxypool.InvalidConfig, match="redis://"):
        proxypool.Pool(A, redis="http://127.0.0.1:6379")
    with pytest.raises(ValueError, match="pair"):
        proxypool.Pool([3])
    assert issubclass(proxypool.SessionBroken, proxypool.ProxyPoolError)


def test_tunables_reach_the_engine():
    pool = proxypool.Pool(A[:1], max_leases_per_address=2, health={"window": 5, "recent": 5})
    held = [pool.acquire(), pool.acquire()]
    with pytest.raises(proxypool.NoAddressAvailable):
        pool.acquire()
    held[0].release()
    pool.acquire().release()
    with pytest.raises(proxypool.InvalidConfig, match="health.recent"):
        proxypool.Pool(A, health={"recent": 500})


def test_store_unavailable_when_redis_does_not_answer():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(proxypool.StoreUnavailable):
        proxypool.Pool(A, redis=f"redis://127.0.0.1:{port}", redis_timeout=0.3)


def test_async_calls_are_coroutines_that_interleave():
    pool = proxypool.Pool(A)

    async def main():
        leases = await asyncio.gather(*(pool.acquire_async(site="a.example") for _ in range(9)))
        assert len({l.id for l in leases}) == 9
        # Calls without a value give None, as the blocking ones do (not an empty tuple).
        assert await asyncio.gather(
            *(l.release_async("success", latency=0.05) for l in leases)
        ) == [None] * 9
        assert await pool.add_async("http://10.0.0.8:3128") is None
        assert await pool.remove_async("http://10.0.0.8:3128") is None
        assert await pool.end_session_async("nobody") is False
        with pytest.raises(proxypool.UnknownSubPool):
            await pool.acquire_async(sub_pool="x")
        return await pool.snapshot_async()

    snap = asyncio.run(main())
    assert sum(a["totals"]["successes"] for a in snap["addresses"]) == 9


def test_a_managed_lease_releases_with_the_reported_outcome_and_reraises():
    pool = proxypool.Pool(A[:1])

    def totals():
        return pool.snapshot()["addresses"][0]["totals"]

    async def main():
        async with pool.lease(site="a.example") as lease:
            lease.report(proxypool.Outcome.BLOCKED)
        async with pool.lease(site="b.example") as lease:
            lease.report("rate_limited", retry_after=0.01)
        with pytest.raises(ValueError, match="'fine' is not a valid Outcome"):
            lease.report("fine")
        with pytest.raises(ValueError, match=r"\[\] is not a valid Outcome"):
            lease.report([])
        with pytest.raises(KeyError):
            async with pool.lease(site="c.example"):
                raise KeyError("inside")

    asyncio.run(main())
    t = totals()
    # blocked and the exception's connect_error are failures; nothing went out as a success.
    assert (t["leases"], t["successes"], t["failures"], t["rate_limited"]) == (3, 0, 2, 1), t


def test_captcha_markers_are_the_servers_defaults():
    config = pathlib.Path(__file__).parents[2] / "proxypool-server" / "src" / "config.rs"
    block = re.search(r"DEFAULT_CAPTCHA_MARKERS: \[&str; \d+\] = \[(.*?)\];", config.read_text(), re.S)
    assert block, "the server's DEFAULT_CAPTCHA_MARKERS moved"
    assert tuple(re.findall(r'"([^"]*)"', block.group(1))) == proxypool.CAPTCHA_MARKERS


def test_a_cancelled_acquire_leaves_no_lease_behind():
    pool = proxypool.Pool(A[:1], max_leases_per_address=1)

    async def main():
        pending = pool.acquire_async()
        pending.cancel()
        # The lease the cancelled call got is dropped once its result reaches the loop.
        for _ in range(1000):
            if pool.snapshot()["addresses"][0]["totals"]["abandoned"] == 1:
                return await pool.acquire_async()
            await asyncio.sleep(0.001)
        raise AssertionError("the cancelled acquire's lease was never freed")

    lease = asyncio.run(main())
    assert lease.address == A[0]


def test_an_async_call_is_an_asyncio_future():
    # The call object completes the waiting task in place (not through asyncio.Future): what
    # asyncio does with futures must still hold.
    pool = proxypool.Pool(A[:1], max_leases_per_address=1)
    var = contextvars.ContextVar("var")
    roomy = proxypool.Pool(A)

    async def in_context(value):
        var.set(value)
        lease = await roomy.acquire_async()
        seen = var.get()
        await lease.release_async()
        return seen

    async def main():
        assert await asyncio.gather(*(in_context(v) for v in range(5))) == list(range(5))
        call = pool.acquire_async()
        assert asyncio.isfuture(call) and not call.done()
        seen = []
        call.add_done_callback(seen.append)
        lease = await asyncio.wait_for(asyncio.shield(call), 30)
        assert call.done() and call.result() is lease and call.exception() is None
        await asyncio.sleep(0)
        assert seen == [call]
        # The one slot is taken: the error reaches the task through the call.
        with pytest.raises(proxypool.NoAddressAvailable):
            await pool.acquire_async()
        await lease.release_async()
        # A task cancelled while it waits on a call: the call is cancelled with it.
        calls = []

        async def waits():
            calls.append(pool.acquire_async())
            return await calls[0]

        task = asyncio.create_task(waits())
        await asyncio.sleep(0)
        task.cancel("stop")
        with pytest.raises(asyncio.CancelledError):
            await task
        assert calls[0].cancelled() and calls[0]._cancel_message == "stop"
        with pytest.raises(asyncio.CancelledError, match="stop"):
            calls[0].result()

    asyncio.run(main())


def test_calls_belong_to_the_loop_that_runs_them_in_and_out_of_a_drain():
    # A call made by a task the bridge's drain resumed takes the drain's loop without looking
    # it up: it must still be the running loop, in a second asyncio.run and in other threads.
    pool = proxypool.Pool(A)

    async def main():
        running = asyncio.get_running_loop()
        first = pool.acquire_async()  # made outside any drain
        lease = await first
        second = lease.release_async()  # made by the task the drain resumed
        await second
        assert first.get_loop() is running and second.get_loop() is running

    for _ in range(2):
        asyncio.run(main())
    failures = []

    def in_thread():
        try:
            asyncio.run(main())
        except BaseException as e:  # reported by the test, not lost in the thread
            failures.append(e)

    threads = [threading.Thread(target=in_thread) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


def test_probe_results_quarantine_and_bring_back_an_address():
    # No jitter, a 50 ms first wait, no dwell in probing, two passes to return.
    pool = proxypool.Pool(A, backoff={"base": 0.05, "jitter": 0.0},
                          health={"min_dwell": 0, "rise_successes": 2})

    def state():
        return next(a["state"] for a in pool.snapshot()["addresses"] if a["address"] == A[0])

    # A failed probe of an address in service counts as a connect error: enough of them
    # quarantine it. (The 50 ms wait may be over by the next look on a busy machine.)
    for _ in range(10):
        if pool.snapshot()["pool"]["quarantine_entries"]:
            break
        pool.report_probe(A[0], False)
    assert state() in ("quarantined", "probing")
    deadline = time.monotonic() + 5
    while state() != "probing":
        assert time.monotonic() < deadline, "the quarantine wait never ended"
        time.sleep(0.01)
    pool.report_probe(A[0], True)
    assert state() == "probing"

    async def passed():
        await pool.report_probe_async(A[0], True)

    asyncio.run(passed())
    assert state() == "healthy"
    with pytest.raises(proxypool.UnknownAddress):
        pool.report_probe("http://10.9.9.9:3128", True)
    with pytest.raises(proxypool.InvalidAddress):
        pool.report_probe("not a proxy", True)
