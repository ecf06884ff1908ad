"""One pool shared through a throwaway Redis: asyncio tasks, and multiprocessing workers under
both the spawn and the fork start methods, with the lease cap never exceeded."""

import asyncio
import contextlib
import multiprocessing
import os
import signal
import time

import pytest
import redis as redis_client

import proxypool

# More workers than slots (2 addresses x 2 leases): the cap is what holds them back.
ADDRESSES = [f"http://10.0.2.{i}:3128" for i in range(1, 3)]
CAP = 2
WORKERS = 6
LEASES_PER_WORKER = 40
HANG = 60  # seconds: a child that hangs fails the test instead of blocking the suite


def shared_pool(url, name):
    return proxypool.Pool(
        ADDRESSES, redis=url, name=name, max_leases_per_address=CAP, redis_timeout=5
    )


def acquire_retrying(pool):
    # All addresses at their cap: wait for a release (the pool has no queue of its own).
    while True:
        try:
            return pool.acquire()
        except proxypool.NoAddressAvailable:
            time.sleep(0.001)


def work(pool, url, name):
    """Leases in a loop; while holding one, counts it in Redis beside the pool: a count above
    the cap means the pool handed out more leases than it may."""
    counter = redis_client.Redis.from_url(url)
    # Start together (spawned workers take a while to import): a barrier in Redis.
    counter.incr(f"{name}:ready")
    while int(counter.get(f"{name}:ready")) < WORKERS:
        time.sleep(0.001)
    highest = 0
    for _ in range(LEASES_PER_WORKER):
        lease = acquire_retrying(pool)
        key = f"{name}:holding:{lease.address}"
        highest = max(highest, counter.incr(key))
        time.sleep(0.001)
        counter.decr(key)
        lease.release("success", latency=0.05)
    return highest


def spawn_worker(args):
    url, name = args
    return work(shared_pool(url, name), url, name)


# Set by the fork test before the workers fork: they inherit it.
FORKED_POOL = None


def fork_worker(args):
    url, name = args
    return work(FORKED_POOL, url, name)


def successes(pool):
    return sum(a["totals"]["successes"] for a in pool.snapshot()["addresses"])


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_workers_share_one_pool_and_never_exceed_the_cap(redis_url, pool_name, method):
    global FORKED_POOL
    parent = shared_pool(redis_url, pool_name)
    # The parent uses its pool first: its runtime threads and Redis connection are live when
    # the workers fork.
    parent.acquire().release()
    FORKED_POOL = parent
    worker = fork_worker if method == "fork" else spawn_worker
    with multiprocessing.get_context(method).Pool(WORKERS) as workers:
        result = workers.map_async(worker, [(redis_url, pool_name)] * WORKERS)
        highest = result.get(timeout=HANG)
    assert max(highest) <= CAP
    # Contention was real: some worker saw an address at its cap.
    assert max(highest) == CAP
    assert successes(parent) == 1 + WORKERS * LEASES_PER_WORKER
    assert all(a["active_leases"] == 0 for a in parent.snapshot()["addresses"])


def fork_checks(url, name, memory, lease, queue):
    """In a forked child: what works and what is refused."""
    report = {}
    try:
        memory.acquire()
    except proxypool.PoolForked as e:
        report["memory"] = str(e)
    try:
        lease.release()
    except proxypool.PoolForked as e:
        report["lease"] = str(e)
    report["redis"] = FORKED_POOL.acquire().address
    queue.put(report)


def test_a_forked_child_reconnects_and_refuses_what_it_cannot_use(redis_url, pool_name):
    global FORKED_POOL
    FORKED_POOL = shared_pool(redis_url, pool_name)
    held = FORKED_POOL.acquire()
    memory = proxypool.Pool(ADDRESSES)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=fork_checks, args=(redis_url, pool_name, memory, held, queue))
    child.start()
    report = queue.get(timeout=HANG)
    child.join(HANG)
    assert child.exitcode == 0
    assert "in-memory pool" in report["memory"]
    assert "before a fork" in report["lease"]
    assert report["redis"] in ADDRESSES
    # The parent's lease is still the parent's to release; the child's was dropped unreleased
    # just before the child exited, and its abandon was in Redis before the drop returned.
    held.release()
    assert not any(a["active_leases"] for a in FORKED_POOL.snapshot()["addresses"])
    assert FORKED_POOL.snapshot()["pool"]["abandoned"] == 1


KEPT = []


def drop_in_coroutines_and_leave(url, name, how):
    """In a worker: leases dropped unreleased inside coroutines (their abandons only queued),
    then: `settle` and `os._exit` at once; or a plain return with the pool still alive, or with
    it dropped (multiprocessing's exit then runs the package's exit hook before its own
    `os._exit`). Redis holds the last abandons (`CLIENT PAUSE`) past the worker's own end: a
    worker that did not wait for them would take them with it when it closes the connection."""

    async def main():
        pool = shared_pool(url, name)
        if how == "alive":
            KEPT.append(pool)
        for round in range(3):
            leases = [await pool.acquire_async() for _ in range(CAP * len(ADDRESSES))]
            if round == 2:
                redis_client.Redis.from_url(url).execute_command("CLIENT", "PAUSE", 300, "WRITE")
            del leases
        if how == "settle":
            await pool.settle_async()
            pool.settle()

    asyncio.run(main())
    if how == "settle":
        os._exit(0)


@pytest.mark.parametrize("method", ["spawn", "fork"])
@pytest.mark.parametrize("how", ["settle", "alive", "dropped"])
def test_a_worker_leaving_after_dropping_leases_in_coroutines_frees_them(
    redis_url, pool_name, how, method
):
    child = multiprocessing.get_context(method).Process(
        target=drop_in_coroutines_and_leave, args=(redis_url, pool_name, how)
    )
    child.start()
    child.join(HANG)
    assert child.exitcode == 0
    snapshot = shared_pool(redis_url, pool_name).snapshot()
    assert not any(a["active_leases"] for a in snapshot["addresses"])
    assert snapshot["pool"]["abandoned"] == 3 * CAP * len(ADDRESSES)


def test_fifty_asyncio_tasks_through_redis_keep_the_cap(redis_url, pool_name):
    pool = shared_pool(redis_url, pool_name)
    holding = {a: 0 for a in ADDRESSES}
    highest = 0

    async def task():
        nonlocal highest
        for _ in range(6):
            while True:
                try:
                    lease = await pool.acquire_async(site="shop.example")
                    break
                except proxypool.NoAddressAvailable:
                    await asyncio.sleep(0.001)
            holding[lease.address] += 1
            highest = max(highest, holding[lease.address])
            await asyncio.sleep(0.001)
            holding[lease.address] -= 1
            await lease.release_async("success", latency=0.02)

    async def main():
        await asyncio.wait_for(asyncio.gather(*(task() for _ in range(50))), HANG)

    asyncio.run(main())
    assert highest == CAP
    assert successes(pool) == 300


def active_leases(pool):
    return sum(a["active_leases"] for a in pool.snapshot()["addresses"])


def test_answers_of_one_batch_resume_every_task_and_cancelled_calls_free_their_leases(
    redis_url, pool_name
):
    # Calls are polled on the loop's thread and their answers come back in batches: every task
    # of a batch resumes, and one cancelled by a task resumed earlier in the same drain takes
    # no lease (it is dropped, abandoned).
    pool = proxypool.Pool(
        ADDRESSES, redis=redis_url, name=pool_name, max_leases_per_address=100, redis_timeout=5
    )
    calls = 150

    async def main():
        pending = [pool.acquire_async(site="shop.example") for _ in range(calls)]
        cancelled = []

        async def waits(i):
            lease = await pending[i]
            # The next call's answer may be in this very batch, not yet delivered.
            if i + 1 < calls and i % 3 == 0 and pending[i + 1].cancel():
                cancelled.append(i + 1)
            return lease

        tasks = [asyncio.create_task(waits(i)) for i in range(calls)]
        done = await asyncio.gather(*tasks, return_exceptions=True)
        leases = [d for d in done if isinstance(d, proxypool.Lease)]
        assert all(isinstance(done[i], asyncio.CancelledError) for i in cancelled)
        assert len(leases) + len(cancelled) == calls
        assert len({lease.id for lease in leases}) == len(leases)
        deadline = time.monotonic() + HANG
        while active_leases(pool) != len(leases):
            assert time.monotonic() < deadline, "a cancelled call's lease was never freed"
            await asyncio.sleep(0.001)
        await asyncio.gather(*(lease.release_async("success", latency=0.02) for lease in leases))
        # An error found before any Redis round trip still arrives through the loop.
        call = pool.acquire_async(sub_pool="nope")
        assert not call.done()
        with pytest.raises(proxypool.UnknownSubPool):
            await call
        return len(cancelled)

    assert asyncio.run(asyncio.wait_for(main(), HANG)) > 0
    assert active_leases(pool) == 0


def test_calls_made_by_tasks_a_drain_resumes_all_complete_and_cancelled_ones_free_leases(
    redis_url, pool_name
):
    # A drain polls the calls its resumed tasks make once all have resumed: each is still
    # answered, in order per task, and one cancelled before that first poll takes no lease.
    pool = proxypool.Pool(
        ADDRESSES, redis=redis_url, name=pool_name, max_leases_per_address=100, redis_timeout=5
    )
    tasks, rounds = 40, 5

    async def worker(t):
        released = 0
        for i in range(rounds):
            lease = await pool.acquire_async()
            # Made in the drain that resumed this task, cancelled before its first poll.
            dropped = pool.acquire_async()
            assert dropped.cancel()
            await lease.release_async("success", latency=0.01 * (1 + (t + i) % 5))
            assert lease.released
            released += 1
        return released

    async def main():
        done = await asyncio.gather(*(worker(t) for t in range(tasks)))
        assert done == [rounds] * tasks
        deadline = time.monotonic() + HANG
        while active_leases(pool) != 0:
            assert time.monotonic() < deadline, "a cancelled call's lease was never freed"
            await asyncio.sleep(0.001)

    asyncio.run(asyncio.wait_for(main(), HANG))
    assert active_leases(pool) == 0


def test_sticky_sessions_are_shared_between_pools_on_one_redis(redis_url, pool_name):
    a = shared_pool(redis_url, pool_name)
    b = shared_pool(redis_url, pool_name)
    first = a.acquire(key="account-1")
    first.release()
    again = b.acquire(key="account-1")
    assert (again.address, again.choice) == (first.address, "bound")
    again.release()
    assert b.end_session("account-1")
    assert a.acquire(key="account-1").choice == "hashed"


@contextlib.contextmanager
def redis_to_freeze(workdir):
    """A Redis of its own: its port, and a function that stops it (SIGSTOP: it accepts and
    never answers, so calls wait their whole timeout) until the block ends."""
    from conftest import _start, _stop

    port, server = _start(
        lambda p: ["redis-server", "--port", str(p), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no"],
        "redis-server",
        workdir,
    )
    try:
        yield port, lambda: os.kill(server.pid, signal.SIGSTOP)
    finally:
        os.kill(server.pid, signal.SIGCONT)
        _stop(server)


def test_a_blocking_call_releases_the_gil_while_redis_does_not_answer(workdir, pool_name):
    import threading

    with redis_to_freeze(workdir) as (port, freeze):
        pool = proxypool.Pool(ADDRESSES, redis=f"redis://127.0.0.1:{port}", name=pool_name,
                              redis_timeout=0.5)
        freeze()
        done = threading.Event()
        errors = []

        def blocked():
            try:
                pool.acquire()
            except proxypool.StoreUnavailable as e:
                errors.append(e)
            done.set()

        threading.Thread(target=blocked).start()
        spins = 0
        while not done.is_set():
            spins += 1
        # The main thread ran Python all along: the waiting call did not hold the GIL.
        assert errors and spins > 500_000


def test_an_asyncio_call_times_out_while_redis_does_not_answer(workdir, pool_name):
    # The call's deadline is a timer of the runtime the loop drives: it fires though no I/O
    # wakes the loop, and the loop runs its other tasks meanwhile.
    with redis_to_freeze(workdir) as (port, freeze):
        pool = proxypool.Pool(ADDRESSES, redis=f"redis://127.0.0.1:{port}", name=pool_name,
                              redis_timeout=0.3)
        freeze()

        async def main():
            ticks = 0

            async def beside():
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            other = asyncio.create_task(beside())
            started = time.monotonic()
            with pytest.raises(proxypool.StoreUnavailable):
                await asyncio.wait_for(pool.acquire_async(), HANG)
            waited = time.monotonic() - started
            other.cancel()
            return waited, ticks

        waited, ticks = asyncio.run(main())
        assert 0.3 <= waited < 2, waited
        assert ticks >= 10, ticks


def test_blocking_threads_and_an_asyncio_loop_share_a_redis_pool(redis_url, pool_name):
    # Blocking calls drive the runtime on their threads while a loop drives it on its own:
    # every call completes and the cap holds.
    import threading

    pool = shared_pool(redis_url, pool_name)
    holding = {a: 0 for a in ADDRESSES}
    highest = 0
    guard = threading.Lock()

    def hold(lease, delta):
        nonlocal highest
        with guard:
            holding[lease.address] += delta
            highest = max(highest, holding[lease.address])

    def blocking():
        for _ in range(40):
            lease = acquire_retrying(pool)
            hold(lease, 1)
            time.sleep(0.001)
            hold(lease, -1)
            lease.release("success", latency=0.02)

    async def task():
        for _ in range(40):
            while True:
                try:
                    lease = await pool.acquire_async()
                    break
                except proxypool.NoAddressAvailable:
                    await asyncio.sleep(0.001)
            hold(lease, 1)
            await asyncio.sleep(0.001)
            hold(lease, -1)
            await lease.release_async("success", latency=0.02)

    async def tasks():
        await asyncio.wait_for(asyncio.gather(*(task() for _ in range(10))), HANG)

    threads = [threading.Thread(target=blocking) for _ in range(3)]
    threads.append(threading.Thread(target=asyncio.run, args=(tasks(),)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG)
    assert not any(t.is_alive() for t in threads)
    assert highest <= CAP
    assert successes(pool) == 3 * 40 + 10 * 40


def address_view(pool, address):
    """What the snapshot says of one address, its cells and its sites, without times."""
    snapshot = pool.snapshot()
    row = next(a for a in snapshot["addresses"] if a["address"] == address)
    kept = ("state", "totals", "window_samples", "success_rate", "captcha_rate")
    return (
        {k: row[k] for k in kept},
        [c for c in snapshot["matrix"] if c["address"] == address],
        snapshot["sites"],
        row["weight"],
    )


def test_a_failed_probe_in_service_counts_alike_in_memory_and_in_redis(redis_url, pool_name):
    # A failed probe of a healthy address is one siteless failure (the memory store is the
    # reference): counted, in the window, weighed, quarantining after three, in both stores.
    addresses = [f"http://10.0.3.{i}:3128" for i in range(1, 5)]
    tunables = dict(backoff={"base": 60, "jitter": 0.0}, seed=1)
    memory = proxypool.Pool(addresses, **tunables)
    shared = proxypool.Pool(addresses, redis=redis_url, name=pool_name, redis_timeout=5, **tunables)
    healthy_weight = address_view(memory, addresses[0])[3]
    for probes in range(1, 4):
        views = []
        for pool in (memory, shared):
            pool.report_probe(addresses[0], False)
            views.append(address_view(pool, addresses[0]))
        (m_row, m_cells, m_sites, m_weight), (r_row, r_cells, r_sites, r_weight) = views
        assert m_row == r_row, f"after {probes} failed probes"
        assert m_row["totals"]["failures"] == probes
        assert m_cells == r_cells and m_sites == r_sites, f"after {probes} failed probes"
        assert m_cells and m_sites
        if m_row["state"] == "healthy":
            # The weight follows the success rate in both (Redis on its stride steps).
            assert m_weight < healthy_weight and r_weight < healthy_weight
    assert m_row["state"] == "quarantined"
