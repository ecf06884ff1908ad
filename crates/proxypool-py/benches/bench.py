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
import json
import os
import random
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import proxypool

ROUNDS = int(os.environ.get("ROUNDS", 5))
RUN = 3.0
TASKS = 50
ADDRESSES = [f"http://10.0.1.{i}:3128" for i in range(1, 51)]


def memory_pair_us():
    """Median wall and thread-CPU microseconds per pair (the CPU time is what a loaded machine
    does not inflate by making the thread wait for a core)."""
    pool = proxypool.Pool(ADDRESSES[:10], max_leases_per_address=1000)
    n = 200_000
    for _ in range(n // 10):
        pool.acquire().release("success", 0.05)
    wall, cpu = [], []
    for _ in range(5):
        started, started_cpu = time.perf_counter(), time.thread_time()
        for _ in range(n):
            pool.acquire().release("success", 0.05)
        wall.append((time.perf_counter() - started) / n * 1e6)
        cpu.append((time.thread_time() - started_cpu) / n * 1e6)
    return statistics.median(wall), statistics.median(cpu)


def cpu_seconds(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def loop_thread_seconds():
    """CPU seconds of the calling thread (the event loop's): the rest of the process's CPU is
    the runtime's threads (the Redis I/O, the batch worker, the wake-ups of the loop)."""
    tick = os.sysconf("SC_CLK_TCK")
    with open(f"/proc/self/task/{threading.get_native_id()}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / tick


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
    started, cpu = time.perf_counter(), cpu_seconds(resource.RUSAGE_SELF)
    loop_cpu = loop_thread_seconds()
    await asyncio.sleep(run)
    stop = True
    await asyncio.gather(*tasks)
    # Pairs per second, the process's CPU microseconds per pair (all its threads), the loop
    # thread's share of it, and pairs.
    return (done / (time.perf_counter() - started),
            (cpu_seconds(resource.RUSAGE_SELF) - cpu) / done * 1e6,
            (loop_thread_seconds() - loop_cpu) / done * 1e6, done)


def rust_bench():
    """Builds the Rust side (not timed) and returns its executable: each round runs it directly,
    so that no cargo check is in its CPU time (at a few thousand pairs per second under load,
    cargo's 0.3 s was as much as the run's own CPU)."""
    out = subprocess.run(
        ["cargo", "bench", "-q", "--locked", "-p", "proxypool-py", "--bench", "redis_pairs",
         "--no-run", "--message-format=json"],
        check=True, capture_output=True, text=True,
    )
    for line in out.stdout.splitlines():
        message = json.loads(line)
        if message.get("target", {}).get("name") == "redis_pairs" and message.get("executable"):
            return message["executable"]
    sys.exit("cargo built no redis_pairs bench")


def rust_pairs(executable, url, name, run):
    """Pairs per second, the bench process's CPU microseconds per pair, and pairs."""
    cpu = cpu_seconds(resource.RUSAGE_CHILDREN)
    out = subprocess.run([executable, url, name, str(run)], check=True, capture_output=True,
                         text=True)
    rate, pairs = (float(v) for v in out.stdout.split()[-2:])
    return rate, (cpu_seconds(resource.RUSAGE_CHILDREN) - cpu) / pairs * 1e6, pairs


class RedisStats:
    """The server's CPU seconds and FCALLs so far (`INFO cpu commandstats`): per round, the
    server's CPU per pair and the pairs each FCALL carried (its batch size) for each side."""

    def __init__(self, port):
        self.port = port

    def read(self):
        with socket.create_connection(("127.0.0.1", self.port), 5) as s:
            s.sendall(b"INFO cpu commandstats\r\n")
            reply = s.makefile("rb")
            length = int(reply.readline()[1:])  # a bulk string: $LENGTH, then the text
            text = reply.read(length).decode()
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        cpu = float(fields["used_cpu_sys"]) + float(fields["used_cpu_user"])
        fcalls = int(dict(kv.split("=") for kv in fields.get("cmdstat_fcall", "calls=0").split(","))
                     ["calls"])
        return cpu, fcalls

    def per_pair(self, before, pairs):
        """(server CPU microseconds per pair, pairs per FCALL) since `before`."""
        cpu, fcalls = self.read()
        return (cpu - before[0]) / pairs * 1e6, pairs / max(fcalls - before[1], 1)


def load():
    return "load average " + " ".join(f"{v:.1f}" for v in os.getloadavg())


def main():
    print(f"{load()}, {os.cpu_count()} cores")
    wall, cpu = memory_pair_us()
    print(f"memory: acquire+release pair from one sync thread: {wall:.2f} us wall, "
          f"{cpu:.2f} us thread CPU (bar 2)")
    workdir = tempfile.mkdtemp()
    port, server = start_redis(workdir)
    # Stopped with the bench: a SIGTERM runs the `finally` below as an interrupt would.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    url, name = f"redis://127.0.0.1:{port}", "bench"
    try:
        pool = proxypool.Pool(ADDRESSES, redis=url, name=name, max_leases_per_address=1000,
                              redis_timeout=5)
        # Warms both up.
        rust_exe = rust_bench()
        rust_pairs(rust_exe, url, name, 1.0)
        asyncio.run(python_pairs(pool, 1.0))
        stats = RedisStats(port)
        ratios, cpu_ratios = [], []
        for r in range(1, ROUNDS + 1):
            before = stats.read()
            rust, rust_cpu, pairs = rust_pairs(rust_exe, url, name, RUN)
            rust_server, rust_batch = stats.per_pair(before, pairs)
            before = stats.read()
            py, py_cpu, py_loop, pairs = asyncio.run(python_pairs(pool, RUN))
            py_server, py_batch = stats.per_pair(before, pairs)
            ratios.append(py / rust)
            cpu_ratios.append(py_cpu / rust_cpu)
            print(f"round {r}: Redis, {TASKS} tasks keyless: Rust {rust:.0f} pairs/s "
                  f"({rust_cpu:.1f} us CPU/pair; server {rust_server:.1f} us/pair, "
                  f"{rust_batch:.1f} pairs/FCALL), Python asyncio {py:.0f} pairs/s "
                  f"({py_cpu:.1f} us CPU/pair, loop thread {py_loop:.1f}; "
                  f"server {py_server:.1f} us/pair, "
                  f"{py_batch:.1f} pairs/FCALL), ratio {py / rust:.2f}")
        print(f"median ratio Python/Rust over {ROUNDS} rounds: {statistics.median(ratios):.2f} "
              f"(bar 0.9); CPU per pair Python/Rust: {statistics.median(cpu_ratios):.2f}; "
              f"{load()}")
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
