#!/usr/bin/env bash
# End-to-end cost of pgfence, measured against the anchor users already accept: PgBouncer in
# session mode (one server connection per client, like pgfence). Everything runs on this machine,
# on loopback, against one throwaway Postgres.
#
#   bash benches/pgbench_compare.sh            # or: make bench-pgbench
#   ROUNDS=1 DURATION=5 bash benches/pgbench_compare.sh
#   TARGETS="pgfence fenced" ...               # the cost of fencing: a second pgfence that fences
#                                              # the four pgbench tables, epoch 1 per session
#   TARGETS="pgfence rewrite" ...              # rewrite mode on pgbench_accounts (adds last_epoch)
#   TARGETS="direct pgbouncer" ...             # without pgfence
#   TARGETS="pgfence noop fenced" WORKLOADS=tpcb-like ...
#                                              # fencing against its floor (see "noop" below)
#   TARGETS="pgfence fenced handguard rewrite handrewrite" WORKLOADS=tpcb-like ...
#                                              # what Postgres costs for the same SQL sent by the
#                                              # client itself (see "handguard" below)
#
# What it does, and why:
# - Throughput: pgbench (scale 10, c=8 j=2) for select-only (-S) and tpcb-like, each in
#   -M simple|extended|prepared, against direct Postgres, PgBouncer and pgfence. The machines are
#   shared and absolute TPS drifts 25-40 % between rounds while paired ratios stay within a few %
#   (docs: FACTS.md), so the targets run in interleaved rounds, in rotating order, and we quote
#   the median of per-round ratios rather than a ratio of medians, with a distribution-free
#   95 % confidence interval of that median (order statistics; from 6 rounds): single rounds
#   swing by 20 % and more, so a few rounds cannot tell 0.93 from 0.97.
# - CPU per transaction of each middleware (utime+stime from /proc/PID/stat around each run): it
#   is what a proxy costs even when the machine has cores to spare. Split into user and system
#   time too: a relaying proxy's system time (its reads and writes on both sockets) is a floor
#   that its own code cannot lower.
# - Latency at c=1, -S -M prepared, with everything pinned to CPU 0: unpinned c=1 runs swing 5x on
#   this VM. Mean and p99 come from pgbench's per-transaction log.
# - The cost of fencing (target "fenced"): a second pgfence process whose config fences
#   pgbench_accounts, _branches, _tellers and _history (reject mode); sessions declare epoch 1 in
#   the startup packet. Every tpcb-like transaction then runs one guard; select-only runs none,
#   so there it shows what merely having fences configured costs. FENCE_LEASE=1 gives the fence
#   a lease table (the guard's lease path). Target "rewrite": a third pgfence with
#   pgbench_accounts in rewrite mode (a last_epoch column is added for every target), so each
#   UPDATE of it gets `last_epoch = 1` and `last_epoch <= 1`; with FENCE_LEASE=1 its fence has
#   a lease row too (a guard in each transaction; without one, pgfence runs no statement of
#   its own: the rewrite alone proves the schema).
# - The floor of any check made inside the transaction (target "noop", tpcb-like -M simple and
#   -M prepared): the unfenced pgfence, with the client itself sending one empty prepared
#   statement (`SELECT 1`) right before each transaction's first write and in the same batch,
#   where fencing puts its guard: in the same Query (`EXECUTE`, simple) or before the same Sync
#   (a pgbench pipeline, prepared). No check that Postgres runs in the writer's transaction can
#   cost less than that statement, so noop/pgfence bounds what fenced/pgfence can reach here.
#   Not with -M extended, where pgbench would parse the empty statement anew each time.
# - What Postgres itself costs for the work fencing adds, with pgfence doing nothing (targets
#   "handguard" and "handrewrite", tpcb-like, through the unfenced pgfence): the client sends,
#   itself, the guard call that fenced's sessions get (-M simple and -M prepared, placed as for
#   noop; needs the fenced target, which registers the fence), or the accounts UPDATE written
#   exactly as rewrite mode rewrites it (every mode; needs the rewrite target). Then
#   handguard/pgfence and handrewrite/pgfence are what the SQL costs in Postgres, and
#   fenced/handguard and rewrite/handrewrite what pgfence adds on top: its analysis, its
#   rewriting, and the replies it swallows.
# - Memory: RSS growth of each middleware with IDLE_SESSIONS (500) idle sessions open.
#
# Settings (environment): ROUNDS (5), DURATION seconds per run (10), LATENCY_DURATION (DURATION; 0 skips),
# SCALE (10), CLIENTS (8), THREADS (2), WORKLOADS ("select-only tpcb-like"),
# MODES ("simple extended prepared"), TARGETS ("direct pgbouncer pgfence"), IDLE_SESSIONS (500,
# 0 skips), FENCE_LEASE (0), PGFENCE_BIN (target/release/pgfence, built if missing), PG_BIN (newest
# /usr/lib/postgresql/*/bin), KEEP=1 keeps the work dir. Results land in target/pgbench_compare/.
set -euo pipefail

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10}
LATENCY_DURATION=${LATENCY_DURATION:-$DURATION}
SCALE=${SCALE:-10}
CLIENTS=${CLIENTS:-8}
THREADS=${THREADS:-2}
WORKLOADS=${WORKLOADS:-select-only tpcb-like}
MODES=${MODES:-simple extended prepared}
read -r -a TARGETS <<<"${TARGETS:-direct pgbouncer pgfence}"
IDLE_SESSIONS=${IDLE_SESSIONS:-500}
FENCE_LEASE=${FENCE_LEASE:-0}
KEEP=${KEEP:-0}

ROOT_DIR=$(cd "$(dirname "$0")/.." && pwd)
PGFENCE_BIN=${PGFENCE_BIN:-$ROOT_DIR/target/release/pgfence}
OUT_DIR=$ROOT_DIR/target/pgbench_compare
DB=bench
CLK_TCK=$(getconf CLK_TCK)

log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
die() {
  printf 'pgbench_compare: error: %s\n' "$*" >&2
  exit 1
}
has_target() { [[ " ${TARGETS[*]} " == *" $1 "* ]]; }
# Targets whose client sends SQL of its own through the pgfence target's proxy (below): they
# share its port and process, run tpcb-like only, and have no latency or memory run.
client_sent() { case $1 in noop | handguard | handrewrite) return 0 ;; *) return 1 ;; esac; }

# Postgres and PgBouncer refuse to run as root.
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# "utime stime" of a whole process (all threads), in clock ticks. The command name in field 2
# may contain spaces, so count fields from the closing parenthesis.
proc_times() {
  local stat
  stat=$(<"/proc/$1/stat")
  stat=${stat##*) }
  # shellcheck disable=SC2086 # word splitting is the point
  set -- $stat
  echo "${12} ${13}"
}

# utime + stime, and stime alone.
cpu_ticks() {
  local u s
  read -r u s <<<"$(proc_times "$1")"
  echo $((u + s))
}
sys_ticks() {
  local u s
  read -r u s <<<"$(proc_times "$1")"
  echo "$s"
}

# CPU ticks of the whole Postgres server: the postmaster with the children it has reaped
# (cutime/cstime: backends that exited during a run still count) plus its live children.
server_ticks() {
  local stat total pid
  stat=$(<"/proc/$PG_PID/stat")
  stat=${stat##*) }
  # shellcheck disable=SC2086 # word splitting is the point
  set -- $stat
  total=$((${12} + ${13} + ${14} + ${15}))
  for pid in $(pgrep -P "$PG_PID"); do
    total=$((total + $(cpu_ticks "$pid" 2>/dev/null || echo 0)))
  done
  echo "$total"
}
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

# wait_port PORT PID NAME LOGFILE: until PORT accepts TCP; fails with the log if PID dies first.
wait_port() {
  local port=$1 pid=$2 name=$3 logfile=$4 i
  for i in $(seq 200); do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$logfile" >&2 || true
      die "$name exited during startup (log above: $logfile)"
    fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  tail -n 30 "$logfile" >&2 || true
  die "$name did not listen on 127.0.0.1:$port within 20 s (log above: $logfile)"
}

## setup -----------------------------------------------------------------------------------------

PG_BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
[ -x "$PG_BIN/initdb" ] || die "no PostgreSQL server binaries (set PG_BIN or run: make setup)"
PGBENCH=$PG_BIN/pgbench
PSQL=$PG_BIN/psql
for tool in python3 taskset; do command -v "$tool" >/dev/null || die "$tool not found"; done
if has_target pgbouncer; then
  BOUNCER=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)
  [ -x "$BOUNCER" ] || die "pgbouncer not installed (run: make bench-setup)"
fi
for target in noop handguard handrewrite; do
  if has_target "$target" && ! has_target pgfence; then
    die "target $target runs through the pgfence target's proxy: add pgfence to TARGETS"
  fi
done
if has_target handguard && { ! has_target fenced || [ "$FENCE_LEASE" = 1 ]; }; then
  die "target handguard calls the guard of the fenced target's fence, without a lease: add fenced to TARGETS, FENCE_LEASE=0"
fi
if has_target handrewrite && ! has_target rewrite; then
  die "target handrewrite writes the rewrite target's epoch column: add rewrite to TARGETS"
fi
if has_target pgfence || has_target fenced || has_target rewrite; then
  if [ ! -x "$PGFENCE_BIN" ]; then
    log "building $PGFENCE_BIN"
    (cd "$ROOT_DIR" && cargo build --release --locked) ||
      die "could not build pgfence; run with TARGETS='direct pgbouncer' to compare the others"
  fi
fi

# Every session in the idle test is one upstream backend, through either middleware.
MAX_CONNECTIONS=$((IDLE_SESSIONS + 50 > 100 ? IDLE_SESSIONS + 50 : 100))
[ "$(ulimit -n)" -ge $((4 * MAX_CONNECTIONS)) ] || ulimit -n $((4 * MAX_CONNECTIONS))

WORK=$(mktemp -d /tmp/pgfence-bench.XXXXXX)
chmod 755 "$WORK"
[ "$(id -u)" != 0 ] || chown postgres: "$WORK"
PG_PID= BOUNCER_PID= PGFENCE_PID= FENCED_PID= REWRITE_PID= IDLE_PID=

cleanup() {
  local rc=$? pid
  set +e
  [ -z "$IDLE_PID" ] || kill "$IDLE_PID" 2>/dev/null
  # SIGTERM (drain) rather than SIGINT: background jobs of a script start with SIGINT ignored.
  [ -z "$PGFENCE_PID" ] || kill -TERM "$PGFENCE_PID" 2>/dev/null
  [ -z "$FENCED_PID" ] || kill -TERM "$FENCED_PID" 2>/dev/null
  [ -z "$REWRITE_PID" ] || kill -TERM "$REWRITE_PID" 2>/dev/null
  [ -z "$BOUNCER_PID" ] || kill -TERM "$BOUNCER_PID" 2>/dev/null
  # Immediate shutdown: nothing here needs to survive.
  [ -z "$PG_PID" ] || kill -QUIT "$PG_PID" 2>/dev/null
  for pid in $IDLE_PID $PGFENCE_PID $FENCED_PID $REWRITE_PID $BOUNCER_PID $PG_PID; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
  done
  wait 2>/dev/null
  if [ "$KEEP" = 1 ] || [ "$rc" != 0 ]; then
    log "work dir kept: $WORK"
  else
    rm -rf "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "initdb ($PG_BIN)"
as_pg "$PG_BIN/initdb" -D "$WORK/data" -A trust -U postgres --no-sync -E UTF8 --locale=C >"$WORK/initdb.log"
PGPORT=$(free_port)
# The harness settings (durability off, as in tests/it/common/pg.rs) plus a buffer pool that
# holds the scale-10 data set, so select-only measures the wire, not the page cache. No
# autovacuum: tpcb-like TPS of neighbouring runs swung up to 3x on two cores, and a worker waking
# mid-run is one cause that can be removed; pgbench vacuums the tables it updates before every
# run instead.
as_pg "$PG_BIN/postgres" -D "$WORK/data" -p "$PGPORT" -k "$WORK" -c listen_addresses=127.0.0.1 \
  -c fsync=off -c full_page_writes=off -c synchronous_commit=off -c shared_buffers=256MB -c autovacuum=off \
  -c max_connections="$MAX_CONNECTIONS" >"$WORK/postgres.log" 2>&1 &
wait_port "$PGPORT" $! postgres "$WORK/postgres.log"
until "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PGPORT"; do sleep 0.1; done
PG_PID=$(head -n 1 "$WORK/data/postmaster.pid")

export PGUSER=postgres PGHOST=127.0.0.1
"$PSQL" -X -q -p "$PGPORT" -d postgres -c "CREATE DATABASE $DB"
log "pgbench -i -s $SCALE"
"$PGBENCH" -i -q -s "$SCALE" -p "$PGPORT" "$DB" >"$WORK/pgbench-init.log" 2>&1 ||
  { cat "$WORK/pgbench-init.log" >&2; die "pgbench -i failed"; }

if has_target pgbouncer; then
  BPORT=$(free_port)
  echo '"postgres" ""' >"$WORK/userlist.txt"
  cat >"$WORK/pgbouncer.ini" <<EOF
[databases]
* = host=127.0.0.1 port=$PGPORT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $BPORT
unix_socket_dir =
auth_type = trust
auth_file = $WORK/userlist.txt
pool_mode = session
admin_users = postgres
max_client_conn = $((IDLE_SESSIONS + 100))
default_pool_size = $((IDLE_SESSIONS + 10))
logfile = $WORK/pgbouncer.log
pidfile = $WORK/pgbouncer.pid
EOF
  : >"$WORK/pgbouncer.log" # both pgbouncer (as postgres) and its stderr write here
  [ "$(id -u)" != 0 ] || chown postgres: "$WORK"/pgbouncer.ini "$WORK"/userlist.txt "$WORK"/pgbouncer.log
  as_pg "$BOUNCER" -q "$WORK/pgbouncer.ini" >>"$WORK/pgbouncer.log" 2>&1 &
  wait_port "$BPORT" $! pgbouncer "$WORK/pgbouncer.log"
  BOUNCER_PID=$(<"$WORK/pgbouncer.pid")
fi

# pgfence_config NAME PORT: starts $WORK/NAME.toml, listening on PORT in front of Postgres;
# the caller appends its [[fence]] sections.
pgfence_config() {
  printf 'listen = "127.0.0.1:%s"\nupstream = "127.0.0.1:%s"\n' "$2" "$PGPORT" >"$WORK/$1.toml"
}
# start_pgfence NAME PORT: serves $WORK/NAME.toml (log $WORK/NAME.log) until PORT accepts;
# sets STARTED_PID.
start_pgfence() {
  RUST_LOG=${PGFENCE_LOG:-info} NO_COLOR=1 "$PGFENCE_BIN" serve --config "$WORK/$1.toml" >"$WORK/$1.log" 2>&1 &
  STARTED_PID=$!
  wait_port "$2" "$STARTED_PID" "pgfence $1 ($PGFENCE_BIN)" "$WORK/$1.log"
}

if has_target pgfence; then
  FPORT=$(free_port)
  pgfence_config pgfence "$FPORT"
  start_pgfence pgfence "$FPORT"
  PGFENCE_PID=$STARTED_PID
fi

# The same binary with the four pgbench tables fenced; its sessions declare epoch 1.
FENCED_OPTIONS='-c pgfence.epoch=1'
FENCING=

# The seed's lease table, for FENCE_LEASE=1 (the fenced and rewrite targets share it).
lease_table() {
  "$PSQL" -X -q -p "$PGPORT" -d "$DB" -c "CREATE TABLE IF NOT EXISTS leader_lease (name text PRIMARY KEY, holder text,
    epoch bigint NOT NULL DEFAULT 0, expires_at timestamptz NOT NULL DEFAULT '-infinity')"
}
if has_target fenced; then
  FFPORT=$(free_port)
  pgfence_config fenced "$FFPORT"
  cat >>"$WORK/fenced.toml" <<EOF

[[fence]]
name = "pgbench"
tables = ["pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history"]
EOF
  FENCING="fenced: pgbench tables in reject mode, no lease"
  if [ "$FENCE_LEASE" = 1 ]; then
    lease_table
    printf '[fence.lease]\ntable = "public.leader_lease"\n' >>"$WORK/fenced.toml"
    FENCING="fenced: pgbench tables in reject mode, with a lease table"
  fi
  "$PGFENCE_BIN" init --database-url "postgres://postgres@127.0.0.1:$PGPORT/$DB" --config "$WORK/fenced.toml" \
    >"$WORK/pgfence-init.log" 2>&1 || { cat "$WORK/pgfence-init.log" >&2; die "pgfence init failed"; }
  # The lease grants epoch 1 (inserted after init, so the trigger records it).
  [ "$FENCE_LEASE" != 1 ] || "$PSQL" -X -q -p "$PGPORT" -d "$DB" \
    -c "INSERT INTO leader_lease VALUES ('pgbench', 'bench', 1, 'infinity')"
  start_pgfence fenced "$FFPORT"
  FENCED_PID=$STARTED_PID
fi

# Rewrite mode: pgbench_accounts carries last_epoch (the column is added for every target,
# so all of them run on the same table) and a third pgfence rewrites its writes for epoch 1.
if has_target rewrite; then
  "$PSQL" -X -q -p "$PGPORT" -d "$DB" -c "ALTER TABLE pgbench_accounts ADD COLUMN last_epoch bigint NOT NULL DEFAULT 0" \
    -c "VACUUM ANALYZE pgbench_accounts"
  RWPORT=$(free_port)
  pgfence_config rewrite "$RWPORT"
  cat >>"$WORK/rewrite.toml" <<EOF

[[fence]]
name = "pgbench-rows"
tables = ["pgbench_accounts"]
mode = "rewrite"
epoch_column = "last_epoch"
EOF
  REWRITING="rewrite: pgbench_accounts in rewrite mode"
  if [ "$FENCE_LEASE" = 1 ]; then
    lease_table
    printf '[fence.lease]\ntable = "public.leader_lease"\n' >>"$WORK/rewrite.toml"
    REWRITING="$REWRITING, with a lease table"
  fi
  # Rewrite fences need the schema too (without it their writes get PF005); init is idempotent.
  "$PGFENCE_BIN" init --database-url "postgres://postgres@127.0.0.1:$PGPORT/$DB" --config "$WORK/rewrite.toml" \
    >>"$WORK/pgfence-init.log" 2>&1 || { cat "$WORK/pgfence-init.log" >&2; die "pgfence init failed"; }
  [ "$FENCE_LEASE" != 1 ] || "$PSQL" -X -q -p "$PGPORT" -d "$DB" \
    -c "INSERT INTO leader_lease VALUES ('pgbench-rows', 'bench', 1, 'infinity')"
  start_pgfence rewrite "$RWPORT"
  REWRITE_PID=$STARTED_PID
  FENCING="${FENCING:+$FENCING; }$REWRITING"
fi

# The noop target's transactions: pgbench's built-in tpcb-like, with one empty prepared statement
# sent in the same Query as the first UPDATE (simple), or in the same pipeline (prepared).
# The variables, and the statements after the first UPDATE, as in the built-in script.
noop_vars='\set aid random(1, 100000 * :scale)
\set bid random(1, 1 * :scale)
\set tid random(1, 10 * :scale)
\set delta random(-5000, 5000)'
noop_rest='SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;
UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = :bid;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (:tid, :bid, :aid, :delta, CURRENT_TIMESTAMP);
END;'
noop_first='UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;'
cat >"$WORK/noop.sql" <<SQL
$noop_vars
\\if :noop_prepared = 0
PREPARE noop_check AS SELECT 1;
\\set noop_prepared 1
\\endif
BEGIN;
EXECUTE noop_check \\; $noop_first
$noop_rest
SQL
cat >"$WORK/noop-pipeline.sql" <<SQL
$noop_vars
BEGIN;
\\startpipeline
SELECT 1;
$noop_first
\\endpipeline
$noop_rest
SQL
# The handguard target's: the same, with the guard call fenced's sessions get (epoch 1, no
# lease) in place of the empty statement.
hand_guard="SELECT pgfence.guard('pgbench', 1, NULL, true)"
sed "s/^PREPARE noop_check AS SELECT 1;/PREPARE noop_check AS $hand_guard;/" "$WORK/noop.sql" >"$WORK/handguard.sql"
sed "s/^SELECT 1;/$hand_guard;/" "$WORK/noop-pipeline.sql" >"$WORK/handguard-pipeline.sql"
# The handrewrite target's: pgbench's tpcb-like with the accounts UPDATE as rewrite mode sends it
# for epoch 1 (a unit test, the_pgbench_accounts_update_is_rewritten_as_the_benchmark_sends_it,
# fails when the two differ).
cat >"$WORK/handrewrite.sql" <<SQL
$noop_vars
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + :delta, last_epoch = 1::pgfence.epoch WHERE (aid = :aid) AND coalesce(pgbench_accounts.last_epoch, 0) <= 1::pgfence.epoch;
$noop_rest
SQL

port_of() {
  ! client_sent "$1" || set -- pgfence
  case $1 in direct) echo "$PGPORT" ;; pgbouncer) echo "$BPORT" ;; pgfence) echo "$FPORT" ;; fenced) echo "$FFPORT" ;; rewrite) echo "$RWPORT" ;; esac
}
pid_of() {
  ! client_sent "$1" || set -- pgfence
  case $1 in direct) echo "" ;; pgbouncer) echo "$BOUNCER_PID" ;; pgfence) echo "$PGFENCE_PID" ;; fenced) echo "$FENCED_PID" ;; rewrite) echo "$REWRITE_PID" ;; esac
}

# run_pgbench TARGET ARGS... -> prints "tps transactions middleware_cpu_ticks server_cpu_ticks
# middleware_system_ticks" (middleware ticks "-" for direct). Fails loudly with pgbench's output when a run fails: a
# silent zero would poison medians.
run_pgbench() {
  local target=$1 pid before after sys_before sys_after out tps tx ticks sys server_before server_after
  shift
  pid=$(pid_of "$target")
  [ -z "$pid" ] || { before=$(cpu_ticks "$pid") && sys_before=$(sys_ticks "$pid"); }
  server_before=$(server_ticks)
  # PgBouncer refuses an `options` startup parameter; only pgfence gets the epoch.
  local opts=
  [ "$target" != fenced ] && [ "$target" != rewrite ] || opts=$FENCED_OPTIONS
  out=$(PGOPTIONS=$opts "$@" -p "$(port_of "$target")" "$DB" 2>&1) ||
    { echo "$out" >&2; die "pgbench failed against $target"; }
  [ -z "$pid" ] || { after=$(cpu_ticks "$pid") && sys_after=$(sys_ticks "$pid"); }
  # Let the run's backends exit and be reaped, so their time lands in the postmaster's cutime.
  sleep 0.3
  server_after=$(server_ticks)
  tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | head -n 1)
  tx=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$out")
  [ -n "$tps" ] && [ -n "$tx" ] || { echo "$out" >&2; die "could not read pgbench output ($target)"; }
  if [ -n "$pid" ]; then
    ticks=$((after - before)) sys=$((sys_after - sys_before))
  else
    ticks=- sys=-
  fi
  echo "$tps $tx $ticks $((server_after - server_before)) $sys"
}

# rotated ROUND INDEX: the targets starting at a different one each time, so no target always
# runs first (warm caches) or last (after the others heated the machine).
rotated() {
  local n=${#TARGETS[@]} off=$((($1 + $2) % ${#TARGETS[@]})) i
  for ((i = 0; i < n; i++)); do echo "${TARGETS[$(((off + i) % n))]}"; done
}

## throughput ------------------------------------------------------------------------------------

RESULTS=$WORK/throughput.tsv
: >"$RESULTS"
log "throughput: $ROUNDS round(s) x {$WORKLOADS} x {$MODES} x {${TARGETS[*]}}, ${DURATION}s each"
for ((round = 1; round <= ROUNDS; round++)); do
  k=0
  for workload in $WORKLOADS; do
    for mode in $MODES; do
      k=$((k + 1))
      for target in $(rotated "$round" "$k"); do
        args=("$PGBENCH" -c "$CLIENTS" -j "$THREADS" -T "$DURATION" -M "$mode")
        [ "$workload" != select-only ] || args+=(-S)
        ! client_sent "$target" || [ "$workload" = tpcb-like ] || continue
        case $target in
          noop | handguard)
            case $mode in
              simple) args+=(-f "$WORK/$target.sql" -D noop_prepared=0 -s "$SCALE") ;;
              prepared) args+=(-f "$WORK/$target-pipeline.sql" -s "$SCALE") ;;
              *) continue ;;
            esac
            ;;
          handrewrite) args+=(-f "$WORK/handrewrite.sql" -s "$SCALE") ;;
        esac
        out=$(run_pgbench "$target" "${args[@]}")
        read -r tps tx ticks server sys <<<"$out"
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$workload" "$mode" "$target" "$tps" "$tx" "$ticks" "$server" "$sys" >>"$RESULTS"
        log "round $round $workload $mode $target: $tps tps"
      done
    done
  done
done

## latency at c=1, pinned --------------------------------------------------------------------------

LATENCY=$WORK/latency.tsv
: >"$LATENCY"
if [ "$ROUNDS" -gt 0 ] && [ "$LATENCY_DURATION" != 0 ]; then
  # New backends inherit the postmaster's affinity; -a covers every thread of the proxies.
  for pid in "$PG_PID" $(pgrep -P "$PG_PID") $BOUNCER_PID $PGFENCE_PID $FENCED_PID $REWRITE_PID; do
    taskset -a -p -c 0 "$pid" >/dev/null
  done
  log "latency: c=1 -S -M prepared, pinned to CPU 0, ${LATENCY_DURATION}s per run"
  for ((round = 1; round <= ROUNDS; round++)); do
    for target in $(rotated "$round" 0); do
      ! client_sent "$target" || continue
      prefix=$WORK/lat-$target-$round
      out=$(run_pgbench "$target" taskset -c 0 "$PGBENCH" -c 1 -j 1 -S -M prepared \
        -T "$LATENCY_DURATION" -l --log-prefix="$prefix")
      read -r _ tx ticks _ <<<"$out"
      # Field 3 of the per-transaction log is the latency in microseconds.
      read -r mean p99 < <(cat "$prefix".* | awk '{ print $3 }' | sort -n |
        awk '{ v[NR] = $1; s += $1 } END { i = int(NR * 0.99); if (i < 1) i = 1; printf "%.1f %d\n", s / NR, v[i] }')
      rm -f "$prefix".*
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$target" "$mean" "$p99" "$tx" "$ticks" >>"$LATENCY"
      log "round $round latency $target: mean ${mean} us, p99 ${p99} us"
    done
  done
  for pid in "$PG_PID" $(pgrep -P "$PG_PID") $BOUNCER_PID $PGFENCE_PID $FENCED_PID $REWRITE_PID; do
    taskset -a -p -c "0-$(($(nproc) - 1))" "$pid" >/dev/null
  done
fi

## idle sessions ------------------------------------------------------------------------------------

IDLE=$WORK/idle.tsv
: >"$IDLE"
client_backends() {
  "$PSQL" -X -qAt -p "$PGPORT" -d postgres \
    -c "SELECT count(*) FROM pg_stat_activity WHERE datname = '$DB' AND backend_type = 'client backend'"
}
# PgBouncer keeps server connections pooled after its clients leave, and hands them to the next
# clients: drop them, so that one idle client is one new backend and the server has free slots.
drop_pool() {
  [ "$1" != pgbouncer ] || "$PSQL" -X -q -p "$BPORT" -d pgbouncer -c "KILL $DB" -c "RESUME $DB" >/dev/null
  for _ in $(seq 300); do [ "$(client_backends)" -gt 0 ] || break; sleep 0.1; done
}
if [ "$IDLE_SESSIONS" -gt 0 ]; then
  # Each client runs one query and then sleeps: a session that has been used, now idle.
  printf 'SELECT 1;\n\\sleep 600 s\n' >"$WORK/idle.sql"
  for target in "${TARGETS[@]}"; do
    [ "$target" != direct ] && ! client_sent "$target" || continue
    pid=$(pid_of "$target")
    drop_pool "$target"
    base=$(client_backends)
    before=$(rss_kib "$pid")
    opts=
    [ "$target" != fenced ] && [ "$target" != rewrite ] || opts=$FENCED_OPTIONS
    PGOPTIONS=$opts "$PGBENCH" -n -f "$WORK/idle.sql" -c "$IDLE_SESSIONS" -j 1 -t 1 -p "$(port_of "$target")" "$DB" \
      >"$WORK/idle-$target.log" 2>&1 &
    IDLE_PID=$!
    for _ in $(seq 600); do
      [ "$(client_backends)" -lt $((base + IDLE_SESSIONS)) ] || break
      kill -0 "$IDLE_PID" 2>/dev/null || { cat "$WORK/idle-$target.log" >&2; die "idle clients failed ($target)"; }
      sleep 0.1
    done
    [ "$(client_backends)" -ge $((base + IDLE_SESSIONS)) ] ||
      die "only $(($(client_backends) - base)) of $IDLE_SESSIONS idle sessions opened ($target)"
    sleep 1 # let every session finish its SELECT 1
    after=$(rss_kib "$pid")
    kill "$IDLE_PID"
    wait "$IDLE_PID" 2>/dev/null || true
    IDLE_PID=
    printf '%s\t%s\t%s\t%s\n' "$target" "$IDLE_SESSIONS" "$before" "$after" >>"$IDLE"
    log "idle $target: RSS $before -> $after KiB"
    drop_pool "$target"
  done
fi

## report ----------------------------------------------------------------------------------------

mkdir -p "$OUT_DIR"
cp "$RESULTS" "$LATENCY" "$IDLE" "$OUT_DIR/"
{
  versions="$("$PG_BIN/postgres" --version)${BOUNCER_PID:+, $("$BOUNCER" --version | head -n 1)}"
  echo "pgbench_compare: $(date -u +%FT%TZ), $(nproc) CPUs, $versions${FENCING:+, $FENCING}"
  echo "scale $SCALE, c=$CLIENTS j=$THREADS, ${DURATION}s runs, $ROUNDS interleaved round(s)"
  python3 - "$RESULTS" "$LATENCY" "$IDLE" "$CLK_TCK" "${TARGETS[@]}" <<'PY'
import sys
from collections import defaultdict
from statistics import median

results, latency, idle, clk = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
targets = sys.argv[5:]
middle = [t for t in targets if t != "direct"]

def rows(path):
    with open(path) as f:
        return [line.rstrip("\n").split("\t") for line in f if line.strip()]

def cpu_us(ticks, tx):
    return None if ticks == "-" or int(tx) == 0 else int(ticks) * 1e6 / clk / int(tx)

def fmt(x, spec):
    return "-" if x is None else format(x, spec)

def med(xs):
    xs = [x for x in xs if x is not None]
    return median(xs) if xs else None

# (workload, mode) -> round -> target -> (tps, middleware cpu µs/tx, server cpu µs/tx,
# middleware system cpu µs/tx)
runs = defaultdict(lambda: defaultdict(dict))
for rnd, workload, mode, target, tps, tx, ticks, server, sys_ticks in rows(results):
    runs[(workload, mode)][rnd][target] = (float(tps), cpu_us(ticks, tx), cpu_us(server, tx), cpu_us(sys_ticks, tx))

pairs = [(a, b) for a, b in [("pgbouncer", "direct"), ("pgfence", "direct"), ("pgfence", "pgbouncer"),
                             ("noop", "pgfence"), ("fenced", "pgfence"), ("rewrite", "pgfence"),
                             ("handguard", "pgfence"), ("fenced", "handguard"),
                             ("handrewrite", "pgfence"), ("rewrite", "handrewrite")]
         if a in targets and b in targets]
head = ["workload", "mode"] + [f"{t} tps" for t in targets] + [f"{a}/{b}" for a, b in pairs] \
       + [f"{t} cpu us/tx" for t in middle]
table = []
for (workload, mode), by_round in runs.items():
    row = [workload, mode]
    row += [fmt(med(r[t][0] for r in by_round.values() if t in r), ",.0f") for t in targets]
    row += [fmt(med(r[a][0] / r[b][0] for r in by_round.values() if a in r and b in r), ".2f") for a, b in pairs]
    row += [fmt(med(r[t][1] for r in by_round.values() if t in r), ".1f") for t in middle]
    table.append(row)

def median_ci(xs, level=0.95):
    """A distribution-free confidence interval of the median (order statistics): the
    widest k-th smallest and k-th largest values with P(Binomial(n, 1/2) < k) <= (1 - level) / 2,
    or None when n is too small for one (n < 6 at 95 %)."""
    from math import comb
    xs = sorted(x for x in xs if x is not None)
    n = len(xs)
    k, tail = 0, 0.0
    while k < n and tail + comb(n, k) / 2 ** n <= (1 - level) / 2:
        tail += comb(n, k) / 2 ** n
        k += 1
    return (xs[k - 1], xs[n - k]) if k >= 1 else None

def show(head, table):
    widths = [max(len(str(c)) for c in col) for col in zip(head, *table)]
    for line in [head] + table:
        print("  ".join(str(c).rjust(w) if i > 1 else str(c).ljust(w) for i, (c, w) in enumerate(zip(line, widths))))

print("\nThroughput: median TPS; ratios are medians of per-round paired ratios; middleware CPU per transaction")
show(head, table)

# How far each median ratio can be trusted: on a shared machine single rounds swing far more
# than the differences measured, so a ratio is only as good as its interval.
print("\nPaired per-round ratios: median, 95 % confidence interval of the median, range, rounds")
head_ci = ["workload", "mode", "ratio", "median", "95% CI", "min", "max", "rounds"]
table_ci = []
for (workload, mode), by_round in runs.items():
    for a, b in pairs:
        xs = [r[a][0] / r[b][0] for r in by_round.values() if a in r and b in r]
        if not xs:
            continue
        ci = median_ci(xs)
        table_ci.append([workload, mode, f"{a}/{b}", f"{median(xs):.3f}",
                         "-" if ci is None else f"{ci[0]:.3f}-{ci[1]:.3f}",
                         f"{min(xs):.3f}", f"{max(xs):.3f}", str(len(xs))])
show(head_ci, table_ci)

# CPU is steadier than throughput on a shared machine: what each target costs the server and
# itself per transaction, and, against unfenced pgfence, what fencing adds (the guard's cost).
print("\nCPU per transaction (medians): the Postgres server for each target; what fencing adds (server + middleware) against pgfence")
extra = [t for t in ("noop", "fenced", "rewrite", "handguard", "handrewrite") if t in targets and "pgfence" in targets]
head2 = ["workload", "mode"] + [f"{t} server us" for t in targets] + [f"{t} extra us" for t in extra]
table2 = []
for (workload, mode), by_round in runs.items():
    row = [workload, mode]
    row += [fmt(med(r[t][2] for r in by_round.values() if t in r), ".1f") for t in targets]
    for t in extra:
        row.append(fmt(med((r[t][2] + r[t][1]) - (r["pgfence"][2] + r["pgfence"][1])
                           for r in by_round.values() if t in r and "pgfence" in r
                           and None not in (r[t][1], r[t][2], r["pgfence"][1], r["pgfence"][2])), "+.1f"))
    table2.append(row)
show(head2, table2)

# A proxy that relays each message with one read and one write per side spends most of its CPU
# in the kernel; its own code can only lower the user part.
print("\nMiddleware CPU per transaction (medians), user and system time")
head3 = ["workload", "mode"] + [f"{t} {part} us" for t in middle for part in ("user", "system")]
table3 = []
for (workload, mode), by_round in runs.items():
    row = [workload, mode]
    for t in middle:
        row.append(fmt(med(r[t][1] - r[t][3] for r in by_round.values()
                           if t in r and None not in (r[t][1], r[t][3])), ".1f"))
        row.append(fmt(med(r[t][3] for r in by_round.values() if t in r), ".1f"))
    table3.append(row)
show(head3, table3)

lat = defaultdict(list)
for rnd, target, mean, p99, tx, ticks in rows(latency):
    lat[target].append((float(mean), float(p99), cpu_us(ticks, tx)))
if lat:
    print("\nLatency, c=1 -S -M prepared, everything pinned to CPU 0 (medians over rounds)")
    show(["target", "mean us", "p99 us", "cpu us/tx"],
         [[t, fmt(med(m for m, _, _ in lat[t]), ".1f"), fmt(med(p for _, p, _ in lat[t]), ".0f"),
           fmt(med(c for _, _, c in lat[t]), ".1f")] for t in targets if t in lat])

idle_rows = rows(idle)
if idle_rows:
    print("\nIdle sessions: RSS of the middleware")
    show(["target", "sessions", "RSS before KiB", "RSS after KiB", "KiB/session"],
         [[t, n, b, a, f"{(int(a) - int(b)) / int(n):.1f}"] for t, n, b, a in idle_rows])
PY
} | tee "$OUT_DIR/summary.txt"
