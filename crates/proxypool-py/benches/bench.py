"""The Python bars of issue 20, measured in one run on one machine:

1. an acquire + release pair in memory from one synchronous Python thread (bar: <= 2 us);
2. through Redis, 50 asyncio tasks, against the Rust bench's 50 tokio tasks on the same server
   and pool, rounds alternating (bar: Python >= 0.9 x Rust). Medians over the rounds.

Run: `target/pyvenv/bin/python crates/proxypool-py/benches/bench.py` after
`VIRTUAL_ENV=$PWD/target/pyvenv target/pyvenv/bin/maturin develop --release -m
crates/proxypool-py/Cargo.toml` (a release build: a debug one measures the compiler's
unoptimised code). The machine is shared: compare within a run, never across runs.
"""

import asyncio
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import proxypool

ROUNDS = 3
RUN = 3.0
TASKS = 50
ADDRESSES = [f"http://10.0.1.{i}:3128" for i in range(1, 51)]


def memory_pair_us():
    pool = proxypool.Pool(ADDRESSES[:10], max_leases_per_address=1000)
    n = 200_000
    for _ in range(n // 10):
        pool.acquire().release("success", 0.05)
    best = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(n):
            pool.acquire().release("success", 0.05)
        best.append((time.perf_counter() - started) / n * 1e6)
    return statistics.median(best)


def start_redis(workdir):
    for _ in range(20):
        port = random.randint(20000, 32000)
        p = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], cwd=workdir, stdout=subprocess.DEVNULL,
        )
        for _ in range(200):
            if p.poll() is not None:
                break
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                return port, p
            except OSError:
                time.sleep(0.02)
    sys.exit("no port for redis-server")


async def python_pairs(pool, run):
    stop = False
    done = 0

    async def task(t):
        nonlocal done
        i = 0
        while not stop:
            i += 1
            lease = await pool.acquire_async()
            await lease.release_async("success", (30 + (t * 31 + i * 17) % 100) / 1000)
            done += 1

    tasks = [asyncio.create_task(task(t)) for t in range(TASKS)]
    started = time.perf_counter()
    await asyncio.sleep(run)
    stop = True
    await asyncio.gather(*tasks)
    return done / (time.perf_counter() - started)


def rust_pairs(url, name, run):
    out = subprocess.run(
        ["cargo", "bench", "-q", "--locked", "-p", "proxypool-py", "--bench", "redis_pairs",
         "--", url, name, str(run)],
        check=True, capture_output=True, text=True,
    )
    return float(out.stdout.split()[-1])


def main():
    print(f"memory: acquire+release pair from one sync thread: {memory_pair_us():.2f} us (bar 2)")
    workdir = tempfile.mkdtemp()
    port, server = start_redis(workdir)
    # Stopped with the bench: a SIGTERM runs the `finally` below as an interrupt would.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    url, name = f"redis://127.0.0.1:{port}", "bench"
    try:
        pool = proxypool.Pool(ADDRESSES, redis=url, name=name, max_leases_per_address=1000,
                              redis_timeout=5)
        # Builds the Rust side once (not timed) and warms both up.
        rust_pairs(url, name, 1.0)
        asyncio.run(python_pairs(pool, 1.0))
        ratios = []
        for r in range(1, ROUNDS + 1):
            rust = rust_pairs(url, name, RUN)
            py = asyncio.run(python_pairs(pool, RUN))
            ratios.append(py / rust)
            print(f"round {r}: Redis, {TASKS} tasks keyless: Rust {rust:.0f} pairs/s, "
                  f"Python asyncio {py:.0f} pairs/s, ratio {py / rust:.2}")
        print(f"median ratio Python/Rust over {ROUNDS} rounds: {statistics.median(ratios):.2f} "
              "(bar 0.9)")
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
