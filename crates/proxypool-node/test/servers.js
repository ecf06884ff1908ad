'use strict'
// Real parts on loopback for the suite: a throwaway Redis and Redis Cluster, a tinyproxy upstream leaving from
// 127.0.0.2, and a target site that answers each source address as told.

const { execFileSync, spawn } = require('node:child_process')
const fs = require('node:fs')
const http = require('node:http')
const net = require('node:net')
const os = require('node:os')
const path = require('node:path')

function listening(port, child) {
  return new Promise((resolve) => {
    const deadline = Date.now() + 10_000
    const attempt = () => {
      if (child.exitCode !== null || Date.now() > deadline) return resolve(false)
      const s = net.connect(port, '127.0.0.1')
      s.once('connect', () => { s.destroy(); resolve(true) })
      s.once('error', () => setTimeout(attempt, 20))
    }
    attempt()
  })
}

// A port below the ephemeral range; another try when it was taken.
async function start(argvForPort, what, [low, high] = [20000, 32000]) {
  for (let i = 0; i < 20; i++) {
    const port = low + Math.floor(Math.random() * (high - low))
    const child = spawn(argvForPort(port)[0], argvForPort(port).slice(1), { stdio: 'ignore' })
    if (await listening(port, child)) return { port, stop: () => child.kill() }
    child.kill()
  }
  throw new Error(`no free port for ${what}`)
}

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'proxypool-node-'))

function redis() {
  return start((p) => ['redis-server', '--port', String(p), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], 'redis-server')
}

// A three-master Redis Cluster (no replicas); `url` names two of its nodes (the client finds
// the third).
async function redisCluster() {
  const nodes = []
  const stop = () => nodes.forEach((n) => n.stop())
  try {
    for (let i = 0; i < 3; i++) {
      // A node's cluster bus listens on its port + 10000: both stay below the ephemeral range.
      nodes.push(await start((p) => ['redis-server', '--port', String(p), '--bind', '127.0.0.1', '--save', '',
        '--appendonly', 'no', '--cluster-enabled', 'yes', '--cluster-config-file', path.join(dir, `nodes-${p}.conf`)],
      'redis-server (cluster)', [20000, 22000]))
    }
    execFileSync('redis-cli', ['--cluster', 'create', ...nodes.map((n) => `127.0.0.1:${n.port}`),
      '--cluster-replicas', '0', '--cluster-yes'], { stdio: 'ignore' })
    const deadline = Date.now() + 10_000
    for (const n of nodes) {
      while (!execFileSync('redis-cli', ['-p', String(n.port), 'cluster', 'info'], { encoding: 'utf8' }).includes('cluster_state:ok')) {
        if (Date.now() > deadline) throw new Error(`cluster node ${n.port} never reported cluster_state:ok`)
        await new Promise((resolve) => setTimeout(resolve, 50))
      }
    }
  } catch (e) {
    stop()
    throw e
  }
  return { url: `redis+cluster://${nodes.slice(0, 2).map((n) => `127.0.0.1:${n.port}`).join(',')}`, stop }
}

function tinyproxy(bind) {
  return start((p) => {
    const conf = path.join(dir, `tinyproxy-${p}.conf`)
    fs.writeFileSync(conf, `Port ${p}\nListen 127.0.0.1\nBind ${bind}\nAllow 127.0.0.1\nTimeout 30\nLogLevel Error\nMaxClients 512\n`)
    return ['tinyproxy', '-d', '-c', conf]
  }, `tinyproxy ${bind}`)
}

function site() {
  const behaviour = new Map()
  const server = http.createServer((req, res) => {
    const source = req.socket.remoteAddress.replace(/^::ffff:/, '')
    const mode = behaviour.get(source) || 'ok'
    if (mode === '403') return res.writeHead(403).end('forbidden')
    if (mode === '429') return res.writeHead(429, { 'retry-after': '7' }).end('slow down')
    res.writeHead(200).end(source)
  })
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({
    url: `http://127.0.0.1:${server.address().port}/`,
    behaviour,
    close: () => server.close(),
  })))
}

module.exports = { redis, redisCluster, tinyproxy, site }
