"""Real HTTP clients through real tinyproxy upstreams, leased from the pool."""

import asyncio
import socket

import aiohttp
import httpx
import pytest
import requests

import proxypool
from proxypool import Outcome


def closed_port():
    """A loopback port nobody listens on: a proxy there refuses every connection."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def row(pool, address):
    redacted = [a for a in pool.snapshot()["addresses"] if a["address"] == address]
    assert redacted, f"{address} not in the snapshot"
    return redacted[0]


def test_httpx_through_each_upstream_reports_successes(upstreams, site):
    pool = proxypool.Pool([u.url for u in upstreams], strategy="round_robin", seed=1)
    by_url = {u.url: u.bind for u in upstreams}
    seen = set()
    with httpx.Client() as _:
        for _ in range(6):
            with pool.lease(site="shop.example") as lease:
                with httpx.Client(proxy=lease.address) as client:
                    r = client.get(site.url)
                assert lease.observe(r) is Outcome.SUCCESS
                # The site saw the request leave from the upstream the pool chose.
                assert r.text == by_url[lease.address]
                seen.add(lease.address)
    assert seen == set(by_url)
    snap = pool.snapshot()
    assert sum(a["totals"]["successes"] for a in snap["addresses"]) == 6
    assert all(a["latency_p50_ms"] is not None for a in snap["addresses"])


def test_requests_session_keeps_its_address(upstreams, site):
    pool = proxypool.Pool([u.url for u in upstreams], seed=2)
    by_url = {u.url: u.bind for u in upstreams}
    sources = set()
    session = requests.Session()
    for i in range(5):
        with pool.lease(key="account-7", site="shop.example") as lease:
            if i > 0:
                assert lease.lease.choice == "bound"
            r = session.get(site.url, proxies={"http": lease.address, "https": lease.address})
            lease.observe(r)
            sources.add(r.text)
            assert r.text == by_url[lease.address]
    assert len(sources) == 1
    assert pool.end_session("account-7") is True
    assert pool.end_session("account-7") is False
    assert pool.acquire(key="account-7").choice == "hashed"


def test_failures_quarantine_the_address_and_break_its_session(upstreams, site):
    dead = f"http://127.0.0.1:{closed_port()}"
    # Two good upstreams keep the pool's minimum in service; the cap allows one quarantine.
    pool = proxypool.Pool([upstreams[0].url, upstreams[1].url, dead], min_in_service=1)
    key = next(
        k for k in (f"acct-{i}" for i in range(1000)) if pool.acquire(key=k).address == dead
    )
    failures = 0
    while row(pool, dead)["state"] != "quarantined":
        with pytest.raises(proxypool.SessionBroken if failures >= 3 else requests.ConnectionError):
            with pool.lease(key=key, site="shop.example") as lease:
                assert lease.address == dead
                requests.get(site.url, proxies={"http": lease.address}, timeout=5)
        failures += 1
        assert failures <= 3, row(pool, dead)
    assert row(pool, dead)["totals"]["failures"] == 3
    with pytest.raises(proxypool.SessionBroken) as broken:
        pool.acquire(key=key)
    assert broken.value.key == key and broken.value.address == dead
    # The key starts over on an address in service.
    assert pool.acquire(key=key).address != dead


def test_site_answers_map_to_blocked_rate_limited_and_captcha(upstreams, site):
    up = upstreams[0]
    pool = proxypool.Pool([up.url], min_in_service=1)
    for mode, outcome in (("403", "blocked"), ("429", "rate_limited"), ("captcha", "captcha")):
        site.behaviour[up.bind] = mode
        shop = f"{mode}.example"
        with pool.lease(site=shop) as lease:
            r = httpx.get(site.url, proxy=lease.address)
            assert lease.observe(r) == outcome
        cell = next(c for c in pool.snapshot()["matrix"] if c["site"] == shop)
        if outcome == "rate_limited":
            # Retry-After: 7 cools the address for that site only.
            assert cell["cooling_until_ms"] is not None
            assert cell["totals"]["rate_limited"] == 1
            with pytest.raises(proxypool.NoAddressAvailable):
                pool.acquire(site=shop)
            pool.acquire(site="other.example").release()
        elif outcome == "captcha":
            assert cell["totals"]["captchas"] == 1
        else:
            assert cell["totals"]["failures"] == 1


def test_httpx_timeout_is_reported_as_timeout_and_reraised(upstreams, site):
    up = upstreams[1]
    site.behaviour[up.bind] = "slow"
    pool = proxypool.Pool([up.url], min_in_service=1)
    with pytest.raises(httpx.ReadTimeout):
        with pool.lease() as lease:
            httpx.get(site.url, proxy=lease.address, timeout=0.2)
    assert row(pool, up.url)["totals"]["failures"] == 1
    assert proxypool.outcome_for_exception(httpx.ReadTimeout("x")) is Outcome.TIMEOUT


def test_aiohttp_through_an_upstream_with_async_with(upstreams, site):
    up = upstreams[2]
    dead = f"http://127.0.0.1:{closed_port()}"

    async def main():
        pool = proxypool.Pool([up.url], min_in_service=1)
        async with aiohttp.ClientSession() as http:
            async with pool.lease(site="shop.example") as lease:
                async with http.get(site.url, proxy=lease.address) as r:
                    lease.observe(r, text=await r.text())
                    assert await r.text() == up.bind
            # A connection refused by the proxy: reported and re-raised.
            with pytest.raises(aiohttp.ClientConnectionError) as refused:
                await http.get(site.url, proxy=dead)
        assert proxypool.outcome_for_exception(refused.value) is Outcome.CONNECT_ERROR
        with pytest.raises(aiohttp.ClientConnectionError):
            async with pool.lease() as lease:
                async with aiohttp.ClientSession() as http:
                    await http.get(site.url, proxy=dead)
        return pool.snapshot()

    snap = asyncio.run(main())
    totals = snap["addresses"][0]["totals"]
    assert (totals["successes"], totals["failures"]) == (1, 1)


def test_exception_helpers_know_the_clients_real_errors(site):
    dead = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(requests.ConnectionError) as r_err:
        requests.get(site.url, proxies={"http": dead}, timeout=5)
    with pytest.raises(httpx.ConnectError) as h_err:
        httpx.get(site.url, proxy=dead)
    assert proxypool.outcome_for_exception(r_err.value) is Outcome.CONNECT_ERROR
    assert proxypool.outcome_for_exception(h_err.value) is Outcome.CONNECT_ERROR
    assert proxypool.outcome_for_exception(requests.ReadTimeout()) is Outcome.TIMEOUT
    assert proxypool.outcome_for_exception(TimeoutError()) is Outcome.TIMEOUT
    # Anything else the block raised: the proxy could not carry the work.
    assert proxypool.outcome_for_exception(KeyError()) is Outcome.CONNECT_ERROR
