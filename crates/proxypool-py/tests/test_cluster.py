"""A pool in a three-master Redis Cluster (`redis+cluster://`): two pools share sessions and the
lease cap, asyncio calls go through the Cluster too, and the pool's keys live in it."""

import asyncio
import subprocess
import time

import pytest

import proxypool

ADDRESSES = [f"http://10.0.3.{i}:3128" for i in range(1, 4)]


def cluster_pool(url, name):
    return proxypool.Pool(ADDRESSES, redis=url, name=name, max_leases_per_address=1,
                          redis_timeout=5)


def test_two_pools_share_one_pool_in_the_cluster(redis_cluster_url, pool_name):
    url, ports = redis_cluster_url
    a, b = cluster_pool(url, pool_name), cluster_pool(url, pool_name)
    first = a.acquire(key="account-1")
    # b sees a's lease (cap 1 per address): it is handed the other addresses, then none.
    others = [b.acquire(), b.acquire()]
    assert first.address not in {o.address for o in others}
    with pytest.raises(proxypool.NoAddressAvailable):
        b.acquire()
    first.release("success", latency=0.05)
    again = b.acquire(key="account-1")
    assert (again.address, again.choice) == (first.address, "bound")
    for lease in (again, *others):
        lease.release()
    assert sum(r["totals"]["successes"] for r in a.snapshot()["addresses"]) == 4
    # Every key of the pool is in the Cluster, in the one slot of its hash tag.
    keys = []
    for port in ports:
        keys += subprocess.run(
            ["redis-cli", "-p", str(port), "--scan", "--pattern", f"proxypool:{{{pool_name}}}:*"],
            capture_output=True, text=True, check=True,
        ).stdout.split()
    assert keys, "the pool wrote nothing to the Cluster"
    slot = subprocess.run(["redis-cli", "-p", str(ports[0]), "cluster", "keyslot", keys[0]],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert all(
        subprocess.run(["redis-cli", "-p", str(ports[0]), "cluster", "keyslot", k],
                       capture_output=True, text=True, check=True).stdout.strip() == slot
        for k in keys
    )


def test_asyncio_and_probe_reports_through_the_cluster(redis_cluster_url, pool_name):
    url, _ = redis_cluster_url
    # A 50 ms first quarantine wait without jitter, no dwell in probing, two passes to return.
    pool = proxypool.Pool(ADDRESSES, redis=url, name=pool_name, max_leases_per_address=1,
                          redis_timeout=5, backoff={"base": 0.05, "jitter": 0.0},
                          health={"min_dwell": 0, "rise_successes": 2})
    target = ADDRESSES[0]

    def state():
        return next(a["state"] for a in pool.snapshot()["addresses"] if a["address"] == target)

    async def fail_target():
        # Connect errors through the target, successes elsewhere, until it is quarantined.
        for _ in range(100):
            leases = await asyncio.gather(*(pool.acquire_async() for _ in range(3)))
            await asyncio.gather(*(
                l.release_async("connect_error" if l.address == target else "success")
                for l in leases
            ))
            if (await pool.snapshot_async())["pool"]["quarantine_entries"]:
                return
        raise AssertionError("the failing address was never quarantined")

    async def probe_back():
        await pool.report_probe_async(target, True)
        assert state() == "probing"
        await pool.report_probe_async(target, True)

    asyncio.run(fail_target())
    # The 50 ms wait may be over by the next look on a busy machine.
    assert state() in ("quarantined", "probing")
    deadline = time.monotonic() + 5
    while state() != "probing":
        assert time.monotonic() < deadline, "the quarantine wait never ended"
        time.sleep(0.01)
    asyncio.run(probe_back())
    assert state() == "healthy"
    with pytest.raises(proxypool.UnknownAddress):
        pool.report_probe("http://10.9.9.9:3128", False)


def test_cluster_urls_are_checked():
    for url in ("redis+cluster://127.0.0.1", "redis+cluster://", "redis+cluster://:7000",
                "redis+cluster://127.0.0.1:7000,,", "redis://", "http://127.0.0.1:7000"):
        with pytest.raises(proxypool.InvalidConfig, match="redis\\+cluster://HOST:PORT"):
            proxypool.Pool(ADDRESSES, redis=url)
