'use strict'
// One worker thread of the shared-pool test: its own Pool on the shared Redis pool.
const { workerData } = require('node:worker_threads')
const proxypool = require('../lib.js')

async function main() {
  const { options, holding, highest, leases } = workerData
  const pool = await proxypool.Pool.create(options)
  for (let i = 0; i < leases; i++) {
    let lease
    for (;;) {
      try {
        lease = await pool.acquire()
        break
      } catch (e) {
        // Every address at its cap: wait for a release.
        if (!(e instanceof proxypool.NoAddressAvailable)) throw e
        await new Promise((r) => setTimeout(r, 1))
      }
    }
    const slot = options.addresses.indexOf(lease.address)
    const now = Atomics.add(holding, slot, 1) + 1
    for (let seen = Atomics.load(highest, 0); now > seen; seen = Atomics.load(highest, 0)) {
      if (Atomics.compareExchange(highest, 0, seen, now) === seen) break
    }
    await new Promise((r) => setTimeout(r, 1))
    Atomics.sub(holding, slot, 1)
    await lease.release('success', { latency: 0.05 })
  }
}

main().catch((e) => {
  console.error(e)
  process.exitCode = 1
})
