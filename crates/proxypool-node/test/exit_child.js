'use strict'
// A process that leaves while the abandons of leases it dropped unreleased (taken by the
// garbage collector) are only queued: Redis holds writes (`CLIENT PAUSE`) from before the drop
// until after this process is gone, unless the package waits for them at exit. argv: the
// pool's options as JSON, then how it leaves: 'exit' (process.exit at once), 'end' (the event
// loop runs dry, the pool still referenced), 'dropped' (the pool collected first, then the
// leases).
const { execFileSync } = require('node:child_process')
const proxypool = require('../lib.js')

const collected = new Map()
const registry = new FinalizationRegistry((what) => collected.set(what, (collected.get(what) || 0) + 1))

async function collect(what, until) {
  for (let i = 0; i < 200 && (collected.get(what) || 0) < until; i++) {
    global.gc()
    await new Promise((r) => setImmediate(r))
  }
  if ((collected.get(what) || 0) < until) throw new Error(`${what}: fewer than ${until} collected`)
}

// Every lease the pool can give, watched for collection (taken here: the caller's frame keeps
// no reference to any).
async function takeAll(pool, n) {
  const leases = []
  for (let i = 0; i < n; i++) leases.push(await pool.acquire())
  for (const lease of leases) registry.register(lease, 'lease')
  return leases
}

async function main() {
  const [options, how] = [JSON.parse(process.argv[2]), process.argv[3]]
  let pool = await proxypool.Pool.create(options)
  const n = options.addresses.length * options.tunables.max_leases_per_address
  let leases = await takeAll(pool, n)
  execFileSync('redis-cli', ['-p', new URL(options.redis).port, 'CLIENT', 'PAUSE', '300', 'WRITE'])
  if (how === 'dropped') {
    registry.register(pool, 'pool')
    pool = null
    await collect('pool', 1)
  }
  leases = null
  await collect('lease', n)
  if (how === 'exit') process.exit(0)
  globalThis.kept = pool
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
