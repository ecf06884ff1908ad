'use strict'
// Real parts on loopback for the suite: a throwaway Redis, a tinyproxy upstream leaving from
// 127.0.0.2, and a target site that answers each source address as told.

const { spawn } = require('node:child_process')
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
async function start(argvForPort, what) {
  for (let i = 0; i < 20; i++) {
    const port = 20000 + Math.floor(Math.random() * 12000)
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

module.exports = { redis, tinyproxy, site }
