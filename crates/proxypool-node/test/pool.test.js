'use strict'
// The Node package against real parts: fetch through a tinyproxy upstream (undici's
// ProxyAgent), sticky sessions, typed errors, worker threads sharing one pool in Redis, what a
// leaving process queued reaching Redis, a pool in a Redis Cluster, probe reports.

const assert = require('node:assert/strict')
const { after, before, test } = require('node:test')
const { spawn } = require('node:child_process')
const { once } = require('node:events')
const path = require('node:path')
const { Worker } = require('node:worker_threads')
const { ProxyAgent } = require('undici')

const proxypool = require('../lib.js')
const servers = require('./servers.js')

let upstream, target, redis, cluster
before(async () => {
  // Settled, not raced: what did start is stopped by `after` even when something else failed.
  const started = await Promise.allSettled([
    servers.tinyproxy('127.0.0.2'), servers.site(), servers.redis(), servers.redisCluster(),
  ])
  ;[upstream, target, redis, cluster] = started.map((s) => s.value)
  const failed = started.find((s) => s.status === 'rejected')
  if (failed) throw failed.reason
})
after(() => {
  upstream?.stop()
  target?.close()
  redis?.stop()
  cluster?.stop()
})

const proxyUrl = () => `http://127.0.0.1:${upstream.port}`

test('fetch through the leased upstream, released with what the site answered', async () => {
  const pool = await proxypool.Pool.create({ addresses: [proxyUrl()], tunables: { min_in_service: 1 } })
  for (const [mode, expected] of [['ok', 'success'], ['403', 'blocked'], ['429', 'rate_limited']]) {
    target.behaviour.set('127.0.0.2', mode)
    const site = `${mode}.example`
    const outcome = await pool.withLease({ site }, async (lease) => {
      const dispatcher = new ProxyAgent(lease.address)
      const response = await fetch(target.url, { dispatcher })
      const text = await response.text()
      if (mode === 'ok') assert.equal(text, '127.0.0.2')
      const [outcome, retryAfter] = proxypool.outcomeForResponse(response, text)
      await dispatcher.close()
      return { outcome, retryAfter }
    })
    assert.equal(outcome.outcome, expected)
    const snapshot = await pool.snapshot()
    const cell = snapshot.matrix.find((c) => c.site === site)
    const counted = { success: 'successes', blocked: 'failures', rate_limited: 'rate_limited' }[expected]
    assert.equal(cell.totals[counted], 1)
    if (expected === 'rate_limited') {
      assert.ok(cell.cooling_until_ms > Date.now() + 5000)
      await assert.rejects(pool.acquire({ site }), proxypool.NoAddressAvailable)
    }
  }
})

test('withLease reports a thrown error and throws it again', async () => {
  const pool = await proxypool.Pool.create({ addresses: ['http://127.0.0.1:9'], tunables: { min_in_service: 1 } })
  await assert.rejects(
    pool.withLease({}, (lease) => fetch(target.url, { dispatcher: new ProxyAgent(lease.address) })),
    TypeError,
  )
  await pool.settle()
  const totals = (await pool.snapshot()).addresses[0].totals
  assert.equal(totals.failures, 1)
})

test('sticky sessions, typed errors, add and remove', async () => {
  const pool = await proxypool.Pool.create({
    addresses: ['http://10.0.3.1:3128', 'http://10.0.3.2:3128'],
    subPools: { eu: 'round_robin' },
  })
  const first = await pool.acquire({ key: 'account-1' })
  await first.release('success', { latency: 0.1 })
  const again = await pool.acquire({ key: 'account-1' })
  assert.equal(again.address, first.address)
  assert.equal(again.choice, 'bound')
  await again.release()
  await assert.rejects(again.release(), proxypool.LeaseReleased)
  assert.equal(await pool.endSession('account-1'), true)
  await assert.rejects(pool.acquire({ subPool: 'nope' }), proxypool.UnknownSubPool)
  await assert.rejects(pool.add('ftp://x:1'), proxypool.InvalidAddress)
  await assert.rejects(pool.add('http://10.0.3.1:3128'), proxypool.DuplicateAddress)
  await assert.rejects(first.release(), proxypool.LeaseReleased)
  const lease = await pool.acquire()
  await assert.rejects(lease.release('fine'), proxypool.InvalidArgument)
  await pool.add('http://10.0.3.9:3128', ['eu'])
  assert.equal((await pool.acquire({ subPool: 'eu' })).address, 'http://10.0.3.9:3128')
  await pool.remove('http://10.0.3.9:3128')
  await assert.rejects(proxypool.Pool.create({ addresses: [], tunables: { stiky_ttl: 1 } }), proxypool.InvalidConfig)
  await assert.rejects(
    proxypool.Pool.create({ addresses: [], redis: 'redis://127.0.0.1:1', redisTimeout: 0.3 }),
    proxypool.StoreUnavailable,
  )
})

test('worker threads share one pool through Redis and never exceed the cap', async () => {
  const addresses = ['http://10.0.4.1:3128', 'http://10.0.4.2:3128']
  const cap = 2
  const name = `node-${process.pid}-${Date.now()}`
  // holding[i]: leases of addresses[i] held now, counted by every worker beside the pool.
  const holding = new Int32Array(new SharedArrayBuffer(4 * addresses.length))
  const highest = new Int32Array(new SharedArrayBuffer(4))
  const options = { addresses, redis: `redis://127.0.0.1:${redis.port}`, name, redisTimeout: 5, tunables: { max_leases_per_address: cap } }
  const workers = Array.from({ length: 3 }, () => new Worker(path.join(__dirname, 'worker.js'), {
    workerData: { options, holding, highest, leases: 30 },
  }))
  await Promise.all(workers.map((w) => new Promise((resolve, reject) => {
    w.once('error', reject)
    w.once('exit', (code) => (code === 0 ? resolve() : reject(new Error(`worker exit ${code}`))))
  })))
  assert.equal(Atomics.load(highest, 0), cap)
  const pool = await proxypool.Pool.create(options)
  await pool.settle()
  const snapshot = await pool.snapshot()
  assert.equal(snapshot.addresses.reduce((n, a) => n + a.totals.successes, 0), 90)
  assert.ok(snapshot.addresses.every((a) => a.active_leases === 0))
})

for (const how of ['exit', 'end', 'dropped']) {
  test(`a process leaving right after the collector took its leases frees them (${how})`, async () => {
    const name = `node-exit-${how}-${process.pid}-${Date.now()}`
    const options = {
      addresses: ['http://10.0.5.1:3128', 'http://10.0.5.2:3128'], redis: `redis://127.0.0.1:${redis.port}`,
      name, redisTimeout: 5, tunables: { max_leases_per_address: 3 },
    }
    const child = spawn(process.execPath, ['--expose-gc', path.join(__dirname, 'exit_child.js'), JSON.stringify(options), how],
      { stdio: ['ignore', 'inherit', 'inherit'] })
    const [code] = await once(child, 'exit')
    assert.equal(code, 0)
    const pool = await proxypool.Pool.create(options)
    const snapshot = await pool.snapshot()
    assert.deepEqual(snapshot.addresses.map((a) => a.active_leases), [0, 0])
    assert.equal(snapshot.pool.abandoned, 6)
  })
}

test('two pools share one pool in a Redis Cluster', async () => {
  const options = {
    addresses: ['http://10.0.5.1:3128', 'http://10.0.5.2:3128'],
    redis: cluster.url,
    name: `node-cluster-${process.pid}-${Date.now()}`,
    redisTimeout: 5,
    tunables: { max_leases_per_address: 1 },
  }
  const [a, b] = await Promise.all([proxypool.Pool.create(options), proxypool.Pool.create(options)])
  const first = await a.acquire({ key: 'account-1' })
  const other = await b.acquire()
  assert.notEqual(other.address, first.address)
  await assert.rejects(b.acquire(), proxypool.NoAddressAvailable)
  await first.release('success', { latency: 0.05 })
  const again = await b.acquire({ key: 'account-1' })
  assert.equal(again.address, first.address)
  assert.equal(again.choice, 'bound')
  await Promise.all([again.release(), other.release()])
  const snapshot = await a.snapshot()
  assert.equal(snapshot.addresses.reduce((n, r) => n + r.totals.successes, 0), 3)
  for (const redis of ['redis+cluster://127.0.0.1', 'redis+cluster://', 'http://127.0.0.1:7000']) {
    await assert.rejects(proxypool.Pool.create({ ...options, redis }), proxypool.InvalidConfig)
  }
})

test('probe reports bring a quarantined address back, in memory and in a Redis Cluster', async () => {
  const addresses = ['http://10.0.6.1:3128', 'http://10.0.6.2:3128', 'http://10.0.6.3:3128']
  const [target] = addresses
  // A 50 ms first quarantine wait without jitter, no dwell in probing, two passes to return.
  const tunables = { backoff: { base: 0.05, jitter: 0 }, health: { min_dwell: 0, rise_successes: 2 } }
  for (const store of [{}, { redis: cluster.url, name: `node-probe-${process.pid}-${Date.now()}`, redisTimeout: 5 }]) {
    const pool = await proxypool.Pool.create({ addresses, tunables, ...store })
    const state = async () => (await pool.snapshot()).addresses.find((a) => a.address === target).state
    for (let i = 0; (await pool.snapshot()).pool.quarantine_entries === 0; i++) {
      assert.ok(i < 100, 'the failing address was never quarantined')
      const lease = await pool.acquire()
      await lease.release(lease.address === target ? 'connect_error' : 'success')
    }
    // The 50 ms wait may be over by the next look on a busy machine.
    assert.ok(['quarantined', 'probing'].includes(await state()))
    const deadline = Date.now() + 5000
    while ((await state()) !== 'probing') {
      assert.ok(Date.now() < deadline, 'the quarantine wait never ended')
      await new Promise((resolve) => setTimeout(resolve, 10))
    }
    await pool.reportProbe(target, true)
    assert.equal(await state(), 'probing')
    await pool.reportProbe(target, true)
    assert.equal(await state(), 'healthy')
    await assert.rejects(pool.reportProbe('http://10.9.9.9:3128', true), proxypool.UnknownAddress)
    await assert.rejects(pool.reportProbe('not a proxy', true), proxypool.InvalidAddress)
  }
})

test('a failed probe in service counts alike in memory and in Redis', async () => {
  // One siteless failure (the memory store is the reference): counted, windowed, weighed,
  // quarantining after three, in both stores.
  const addresses = ['http://10.0.7.1:3128', 'http://10.0.7.2:3128', 'http://10.0.7.3:3128', 'http://10.0.7.4:3128']
  const [target] = addresses
  const options = { addresses, seed: 1, tunables: { backoff: { base: 60, jitter: 0 } } }
  const memory = await proxypool.Pool.create(options)
  const shared = await proxypool.Pool.create({
    ...options, redis: `redis://127.0.0.1:${redis.port}`, name: `node-failed-probe-${process.pid}-${Date.now()}`, redisTimeout: 5,
  })
  const view = async (pool) => {
    const snapshot = await pool.snapshot()
    const row = snapshot.addresses.find((a) => a.address === target)
    const { state, totals, window_samples, success_rate, captcha_rate, weight } = row
    const cells = snapshot.matrix.filter((c) => c.address === target)
    return { row: { state, totals, window_samples, success_rate, captcha_rate }, cells, sites: snapshot.sites, weight }
  }
  const healthy = (await view(memory)).weight
  let last
  for (let probes = 1; probes <= 3; probes++) {
    const views = []
    for (const pool of [memory, shared]) {
      await pool.reportProbe(target, false)
      views.push(await view(pool))
    }
    const [m, r] = views
    assert.deepEqual(r.row, m.row, `after ${probes} failed probes`)
    assert.equal(m.row.totals.failures, probes)
    assert.deepEqual(r.cells, m.cells)
    assert.deepEqual(r.sites, m.sites)
    assert.ok(m.cells.length > 0 && m.sites.length > 0)
    if (m.row.state === 'healthy') assert.ok(m.weight < healthy && r.weight < healthy, `weights ${m.weight} ${r.weight}`)
    last = m
  }
  assert.equal(last.row.state, 'quarantined')
})

test('captcha markers are the server defaults', () => {
  const config = require('node:fs').readFileSync(path.join(__dirname, '../../proxypool-server/src/config.rs'), 'utf8')
  const block = /DEFAULT_CAPTCHA_MARKERS: \[&str; \d+\] = \[([\s\S]*?)\];/.exec(config)
  assert.ok(block, "the server's DEFAULT_CAPTCHA_MARKERS moved")
  assert.deepEqual([...block[1].matchAll(/"([^"]*)"/g)].map((m) => m[1]), proxypool.CAPTCHA_MARKERS)
})
