#!/usr/bin/env node
// node-postgres (`pg`) against pgfence: the contract checked with a real driver.
//
// Usage: node node_compat.js [HOST PORT DB [USER]]  (or PGFENCE_HOST / PGFENCE_PORT / PGFENCE_DB / PGFENCE_USER)
//
// Expects the seed's tables and `pgfence init` (see py_compat.py). Prints one PASS/FAIL line per
// check and exits non-zero if any check failed. COPY is not checked: it needs pg-copy-streams,
// which is not a dependency of these tests.
'use strict'

let pg
try {
  pg = require('pg')
} catch (e) {
  console.log(`FAIL require pg: ${e.message} (run \`make setup\`)`)
  process.exit(2)
}
const assert = require('assert')

const args = process.argv.slice(2)
const HOST = args[0] || process.env.PGFENCE_HOST || '127.0.0.1'
const PORT = Number(args[1] || process.env.PGFENCE_PORT || 6432)
const DB = args[2] || process.env.PGFENCE_DB || 'postgres'
const USER = args[3] || process.env.PGFENCE_USER || 'postgres'
const FENCE = 'sweeper'

const checks = []
const failed = []
const check = (name, fn) => checks.push([name, fn])
let E1 = 0

async function connect(epoch, extra = {}) {
  const cfg = { host: HOST, port: PORT, database: DB, user: USER, connectionTimeoutMillis: 10000, ...extra }
  if (epoch !== undefined && epoch !== null) cfg.options = `-c pgfence.epoch=${epoch}`
  const c = new pg.Client(cfg)
  c.on('error', () => {})
  await c.connect()
  return c
}

async function withClient(epoch, fn, extra) {
  const c = await connect(epoch, extra)
  try {
    return await fn(c)
  } finally {
    await c.end().catch(() => {})
  }
}

async function takeover(holder) {
  return withClient(null, async (c) => {
    await c.query("UPDATE leader_lease SET expires_at = '-infinity' WHERE name = $1", [FENCE])
    const r = await c.query(
      "UPDATE leader_lease SET holder = $1, epoch = epoch + 1, expires_at = now() + interval '30 s' " +
        'WHERE name = $2 AND (holder IS NULL OR holder = $1 OR expires_at < now()) RETURNING epoch',
      [holder, FENCE]
    )
    return Number(r.rows[0].epoch)
  })
}

const note = () => withClient(null, async (c) => (await c.query('SELECT note FROM sweep_state WHERE id = 1')).rows[0].note)

async function expectCode(code, promise) {
  try {
    await promise
  } catch (e) {
    assert.strictEqual(e.code, code, `expected ${code}, got ${e.code}: ${e.message}`)
    return e
  }
  throw new Error(`expected ${code}, got success`)
}

const staleMessage = (declared, current) =>
  `pgfence: epoch ${declared} is stale for fence "${FENCE}" (current epoch ${current})`

check('connect_and_simple_query_protocol', () =>
  withClient(null, async (c) => {
    // A query without values goes through the simple protocol; several statements return several results.
    const r = await c.query("SELECT 1 AS a; SELECT 'two' AS b")
    assert.strictEqual(r.length, 2)
    assert.strictEqual(r[1].rows[0].b, 'two')
    assert.strictEqual(c.ssl, false)
  })
)

check('parameterised_queries_text_and_binary', () =>
  withClient(null, async (c) => {
    const r = await c.query('SELECT $1::int + $2::int AS s, $3::text AS t', [40, 2, 'été'])
    assert.deepStrictEqual(r.rows[0], { s: 42, t: 'été' })
    const b = await c.query({ text: 'SELECT $1::int4 AS n', values: [7], binary: true })
    assert.strictEqual(b.rows[0].n, 7)
  })
)

check('named_query_reused_then_rejected_then_usable', () =>
  withClient(E1, async (c) => {
    const upd = (v) => ({ name: 'upd-note', text: 'UPDATE sweep_state SET note = $1 WHERE id = 1', values: [v] })
    for (let i = 0; i < 5; i++) {
      const r = await c.query(upd(`named-${i}`))
      assert.strictEqual(r.rowCount, 1)
    }
    const n = await c.query("SELECT count(*)::int AS n FROM pg_prepared_statements WHERE name = 'upd-note'")
    assert.strictEqual(n.rows[0].n, 1, 'node-pg did not prepare the named statement')
    assert.strictEqual(await note(), 'named-4')
    const old = E1
    E1 = await takeover('node-b')
    const e = await expectCode('PF001', c.query(upd('stale')))
    assert.strictEqual(e.message, staleMessage(old, E1))
    assert.ok(e.hint, 'PF001 without a HINT')
    await expectCode('PF001', c.query(upd('stale')))
    assert.strictEqual((await c.query('SELECT 1 AS x')).rows[0].x, 1)
    await c.query(`SET pgfence.epoch = ${E1}`)
    await c.query(upd('named-new'))
    assert.strictEqual(await note(), 'named-new')
    // A named query with binary results, RETURNING.
    const r = await c.query({
      name: 'ret',
      text: 'UPDATE sweep_state SET note = $1 WHERE id = 1 RETURNING id',
      values: ['ret'],
      binary: true,
    })
    assert.strictEqual(r.rows[0].id, 1)
  })
)

check('transactions_commit_rollback_and_error_inside', () =>
  withClient(E1, async (c) => {
    await c.query('BEGIN')
    await c.query('UPDATE sweep_state SET note = $1 WHERE id = 1', ['tx-commit'])
    await c.query('COMMIT')
    assert.strictEqual(await note(), 'tx-commit')
    await c.query('BEGIN')
    await c.query('UPDATE sweep_state SET note = $1 WHERE id = 1', ['tx-rollback'])
    await c.query('ROLLBACK')
    assert.strictEqual(await note(), 'tx-commit')
    await c.query('BEGIN')
    await c.query('UPDATE sweep_state SET note = $1 WHERE id = 1', ['tx-dup'])
    await expectCode('23505', c.query("INSERT INTO sweep_state (id, note) VALUES (1, 'dup')"))
    await expectCode('25P02', c.query('SELECT 1'))
    await c.query('ROLLBACK')
    assert.strictEqual(await note(), 'tx-commit')
  })
)

check('rejection_inside_transaction_commits_nothing', () =>
  withClient(E1 - 1, async (c) => {
    await c.query('BEGIN')
    await c.query("INSERT INTO audit (note) VALUES ('node-vanish')")
    const e = await expectCode('PF001', c.query('UPDATE sweep_state SET note = $1 WHERE id = 1', ['stale']))
    assert.strictEqual(e.message, staleMessage(E1 - 1, E1))
    const r = await c.query('COMMIT')
    assert.strictEqual(r.command, 'ROLLBACK')
    const n = await c.query("SELECT count(*)::int AS n FROM audit WHERE note = 'node-vanish'")
    assert.strictEqual(n.rows[0].n, 0)
  })
)

check('error_sqlstates', () =>
  withClient(null, async (c) => {
    await expectCode('42P01', c.query('SELECT * FROM no_such_table'))
    await c.query("INSERT INTO audit (id, note) VALUES (-1, 'x')")
    await expectCode('23505', c.query("INSERT INTO audit (id, note) VALUES ($1, 'x')", [-1]))
    const e = await expectCode('PF002', c.query('UPDATE sweep_state SET note = $1 WHERE id = 1', ['none']))
    assert.ok(e.message.includes(FENCE) && e.hint, e)
    await expectCode('PF002', c.query("UPDATE sweep_state SET note = 'none' WHERE id = 1"))
    const e3 = await expectCode('PF003', c.query('SET pgfence.epoch = 0'))
    assert.ok(e3.hint)
    await c.query(`SET pgfence.epoch = ${E1 + 7}`)
    await expectCode('PF003', c.query('UPDATE sweep_state SET note = $1 WHERE id = 1', ['future']))
    assert.strictEqual((await c.query('SELECT 1 AS x')).rows[0].x, 1)
  })
)

check('invalid_startup_epoch_fails_connection_with_pf003', async () => {
  for (const bad of ['0', 'abc', '9223372036854775808', '-1']) {
    const c = new pg.Client({ host: HOST, port: PORT, database: DB, user: USER, options: `-c pgfence.epoch=${bad}` })
    c.on('error', () => {})
    const e = await expectCode('PF003', c.connect())
    assert.ok(e.message.includes('pgfence.epoch'), e.message)
    await c.end().catch(() => {})
  }
})

check('set_local_reset_and_show_follow_postgres', () =>
  withClient(E1, async (c) => {
    const show = async () => (await c.query('SHOW pgfence.epoch')).rows[0]['pgfence.epoch']
    assert.strictEqual(await show(), String(E1))
    await c.query('SET pgfence.epoch = 1')
    assert.strictEqual(await show(), '1')
    await expectCode('PF001', c.query('UPDATE sweep_state SET note = $1 WHERE id = 1', ['x']))
    await c.query('RESET pgfence.epoch')
    assert.strictEqual(await show(), String(E1))
    await c.query('BEGIN')
    await c.query('SET LOCAL pgfence.epoch = 1')
    await expectCode('PF001', c.query('UPDATE sweep_state SET note = $1 WHERE id = 1', ['x']))
    await c.query('ROLLBACK')
    assert.strictEqual(await show(), String(E1))
    await c.query('BEGIN')
    await c.query('SET pgfence.epoch = 1')
    await c.query('ROLLBACK')
    assert.strictEqual(await show(), String(E1))
    await c.query('UPDATE sweep_state SET note = $1 WHERE id = 1', ['after-rollback'])
    await expectCode('PF003', c.query("SET pgfence.epoch = ''"))
    assert.strictEqual(await show(), String(E1))
    await c.query('UPDATE sweep_state SET note = $1 WHERE id = 1', ['after-invalid'])
    assert.strictEqual(await note(), 'after-invalid')
  })
)

check('listen_notify', async () => {
  const listener = await connect()
  const sender = await connect()
  try {
    const got = new Promise((resolve) => listener.on('notification', (m) => resolve(m.payload)))
    await listener.query('LISTEN pgfence_ch')
    await sender.query("NOTIFY pgfence_ch, 'hello'")
    const payload = await Promise.race([got, new Promise((_, rej) => setTimeout(() => rej(new Error('no NOTIFY')), 5000))])
    assert.strictEqual(payload, 'hello')
  } finally {
    await listener.end()
    await sender.end()
  }
})

check('process_id_matches_the_server_and_own_notifies', () =>
  withClient(null, async (c) => {
    const pid = (await c.query('SELECT pg_backend_pid() AS p')).rows[0].p
    assert.strictEqual(c.processID, pid)
    const got = new Promise((resolve) => c.on('notification', (m) => resolve([m.processId, m.payload])))
    await c.query('LISTEN pgfence_self')
    await c.query("NOTIFY pgfence_self, 'me'")
    assert.deepStrictEqual(await got, [pid, 'me'])
  })
)

check('cancel_of_pg_sleep_via_second_connection', () =>
  withClient(null, async (c) => {
    const q = new pg.Query('SELECT pg_sleep(20)')
    const done = new Promise((resolve) => {
      q.on('error', (e) => resolve(e))
      q.on('end', () => resolve(null))
    })
    c.query(q)
    await new Promise((r) => setTimeout(r, 500))
    const canceller = new pg.Client({ host: HOST, port: PORT, database: DB, user: USER })
    canceller.cancel(c, q)
    const started = Date.now()
    const err = await Promise.race([done, new Promise((r) => setTimeout(() => r('timeout'), 10000))])
    assert.ok(err && err.code === '57014', `expected 57014, got ${err && (err.code || err)}`)
    assert.ok(Date.now() - started < 10000)
    assert.strictEqual((await c.query('SELECT 1 AS x')).rows[0].x, 1)
  })
)

check('pipeline_mode_fenced_writes_and_stale_one', async () => {
  await withClient(
    E1,
    async (c) => {
      const ps = []
      for (let i = 0; i < 10; i++) ps.push(c.query('UPDATE sweep_state SET note = $1 WHERE id = 1', [`pipe-${i}`]))
      await Promise.all(ps)
      assert.strictEqual(await note(), 'pipe-9')
      // Mixed: a stale write in the middle fails alone (each pipelined query has its own Sync).
      const r = await Promise.allSettled([
        c.query('UPDATE sweep_state SET note = $1 WHERE id = 1', ['p-a']),
        c.query('SET pgfence.epoch = 1'),
        c.query('UPDATE sweep_state SET note = $1 WHERE id = 1', ['p-stale']),
        c.query("UPDATE sweep_state SET note = 'p-stale-simple' WHERE id = 1"),
        c.query(`SET pgfence.epoch = ${E1}`),
        c.query('UPDATE sweep_state SET note = $1 WHERE id = 1', ['p-b']),
        c.query('SELECT 1 AS x'),
      ])
      const states = r.map((x) => (x.status === 'fulfilled' ? 'ok' : x.reason.code))
      assert.deepStrictEqual(states, ['ok', 'ok', 'PF001', 'PF001', 'ok', 'ok', 'ok'])
      assert.strictEqual(await note(), 'p-b')
    },
    { pipeline: true }
  )
})

check('pool_with_options_epoch', async () => {
  const pool = new pg.Pool({
    host: HOST, port: PORT, database: DB, user: USER, max: 4, options: `-c pgfence.epoch=${E1}`,
  })
  try {
    await Promise.all(
      Array.from({ length: 20 }, (_, i) => pool.query("INSERT INTO sweep_state (id, note) VALUES ($1, 'pool')", [900 + i]))
    )
    const r = await pool.query("SELECT count(*)::int AS n FROM sweep_state WHERE note = 'pool'")
    assert.strictEqual(r.rows[0].n, 20)
  } finally {
    await pool.end()
  }
})

async function main() {
  await takeover('node-0')
  E1 = await takeover('node-a')
  for (const [name, fn] of checks) {
    try {
      await Promise.race([fn(), new Promise((_, rej) => setTimeout(() => rej(new Error('check timed out')), 60000))])
      console.log(`PASS ${name}`)
    } catch (e) {
      failed.push(name)
      console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`)
    }
  }
  if (failed.length) {
    console.log(`node-pg: ${failed.length} check(s) failed: ${failed.join(', ')}`)
    process.exit(1)
  }
  console.log('node-pg: all checks passed')
  process.exit(0)
}

main().catch((e) => {
  console.log(`FAIL main: ${e && e.stack ? e.stack : e}`)
  process.exit(1)
})
