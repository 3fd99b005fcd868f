# shellcheck shell=bash disable=SC2154
# Shared by the tier-2 end-to-end tests (sourced): a real Redis Cluster
# started on 127.0.0.1 with an ACL user k3 that has exactly the rights the
# README lists, k3cached daemons sharing it, k3worker turns, and the
# test's bookkeeping. Needs: build, src, and the caller's own descriptions.
# Without redis-server and redis-cli the caller is skipped (77).
daemon=$build/daemon/k3cached ctl=$build/client/k3cachectl worker=$build/tools/k3worker
conv=$src/tests/worker/conversation.txt
for p in redis-server redis-cli; do
  command -v "$p" >/dev/null || { echo "SKIP: $p is not installed (scripts/install-deps installs it)"; exit 77; }
done
dir=$(mktemp -d /tmp/k3tier2-test-XXXXXX)
pids=()
declare -A dpid
cleanup() {
  for p in "${dpid[@]}" "${pids[@]}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  [ -n "${K3_KEEP_TEST_DIRS:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT
pass=0 fail=0
ok() { if [ "$2" = 0 ]; then pass=$((pass + 1)); echo "ok: $1"; else fail=$((fail + 1)); echo "FAIL: $1"; fi; }
die() { echo "FAIL: $*"; for f in "$dir"/*.log; do echo "== $f"; tail -n 20 "$f"; done; exit 1; }

# ---- the cluster ----------------------------------------------------------------
free_port() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# below the ephemeral ports (32768 up), bus ports (+10000) included: a port a
# client connection holds cannot be bound, though nothing listens on it
base=$((20000 + RANDOM % 2600))
port=()
# pick_ports N: port[0..N) free, each with its cluster bus port (+10000)
pick_ports() {
  local i p
  for ((i = 0; i < $1; i++)); do
    p=$((base + i * 7))
    while ! free_port "$p" || ! free_port $((p + 10000)); do p=$((p + 1)); done
    port[$i]=$p
  done
}
echo k3pass > "$dir/pw"
echo wrong > "$dir/badpw"
# the daemons' user has exactly the rights the README lists (the default
# user, without a password, is the test's own, for its faults)
acl=('~k3:k3cache:*' +get +set +del +exists +hset +hgetall +hdel +expire +scan +zadd +zrange +zrem +rpush +lrange
  +eval '+cluster|slots' +asking +persist +ttl +pttl +pexpire +sadd +srem +scard)
# start_node I [redis-server flags...]: on port[I], or the next free one when
# another process took it meanwhile (another test picking at the same time)
start_node() {
  local i=$1 p=${port[$1]} try
  shift
  mkdir -p "$dir/n$i"
  for try in 1 2 3 4 5; do
    redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes \
      --cluster-config-file "$dir/n$i/nodes.conf" --cluster-node-timeout 2000 --dir "$dir/n$i" \
      --save "" --appendonly no --daemonize no --user k3 on ">k3pass" "${acl[@]}" "$@" \
      > "$dir/redis-$i.log" 2>&1 &
    pids[$i]=$!
    for _ in $(seq 200); do
      redis-cli -p "$p" ping >/dev/null 2>&1 && { port[$i]=$p; return 0; }
      kill -0 "${pids[$i]}" 2>/dev/null || break
      sleep 0.05
    done
    kill -9 "${pids[$i]}" 2>/dev/null; wait "${pids[$i]}" 2>/dev/null
    echo "redis node $i: port $p: $(tail -n 1 "$dir/redis-$i.log") (try $try)"
    p=$((p + 97))
    while ! free_port "$p" || ! free_port $((p + 10000)); do p=$((p + 1)); done
  done
  die "redis node $i did not start"
}
# cluster_ok I...: every node named says cluster_state:ok (waits up to 20 s)
cluster_ok() {
  local n i
  for _ in $(seq 200); do
    n=0
    for i in "$@"; do redis-cli -p "${port[$i]}" cluster info 2>/dev/null | grep -q 'cluster_state:ok' && n=$((n + 1)); done
    [ $n = $# ] && return 0
    sleep 0.1
  done
  return 1
}
# create_cluster REPLICAS I...: redis-cli --cluster create over the nodes named
create_cluster() {
  local replicas=$1 i addrs=()
  shift
  for i in "$@"; do addrs+=("127.0.0.1:${port[$i]}"); done
  yes yes | redis-cli --cluster create "${addrs[@]}" --cluster-replicas "$replicas" \
    --cluster-yes > "$dir/create.log" 2>&1 || die "redis-cli --cluster create"
  cluster_ok "$@" || die "the cluster did not come up"
}

# ---- daemons ------------------------------------------------------------------
# start_daemon NAME [flags...]: its store $dir/NAME.db, its socket $dir/NAME.sock
start_daemon() {
  local name=$1; shift
  "$daemon" --db "$dir/$name.db" --socket "$dir/$name.sock" --tier2 "$seeds" \
    --tier2-user k3 --tier2-password-file "$dir/pw" --tier2-wait 2000 --log-level info "$@" \
    2>>"$dir/$name.log" &
  dpid[$name]=$!
  for _ in $(seq 200); do "$ctl" --socket "$dir/$name.sock" ping >/dev/null 2>&1 && return 0; sleep 0.05; done
  die "daemon $name did not start"
}
stat_of() { "$ctl" --socket "$dir/$1.sock" --json stat | python3 -c "import json,sys; d=json.load(sys.stdin); c=d.get('counters', d); print(c.get('$2', -1))"; }
# waits until daemon NAME has copied (or found there) at least N entries
wait_copies() {
  for _ in $(seq 400); do
    local c e
    c=$(stat_of "$1" tier2_copies) e=$(stat_of "$1" tier2_copies_existing)
    [ $((c + e)) -ge "$2" ] && return 0
    sleep 0.05
  done
  echo "daemon $1: fewer than $2 copies: $(stat_of "$1" tier2_copies) copied, $(stat_of "$1" tier2_copies_failed) failed"
  return 1
}

answers() { grep -E '^(== turn|logits|reply)' "$1"; }
reuse_of() { grep '^\[PREFIX\]' "$1" | sed -n "${2}p" | awk '{print $3}'; }
turn() { # turn DAEMON K OUT SALT
  "$worker" --socket "$dir/$1.sock" --conversation "$conv" --turn "$2" --replies "$3.replies" \
    --salt "$4" >> "$3" 2>>"$3.err"
}

# stop_daemons NAME...: SIGTERM each, then: each stopped cleanly (rc 0) and no
# sanitizer reported anything in its log (an ASan build's leaks show at exit)
stop_daemons() {
  local name rc
  for name in "$@"; do
    kill -TERM "${dpid[$name]}"; wait "${dpid[$name]}"; rc=$?
    ok "daemon $name stops cleanly (rc $rc)" "$rc"
    ok "daemon $name: no sanitizer report in its log" $(! grep -Eq 'Sanitizer|runtime error' "$dir/$name.log"; echo $?)
    dpid[$name]=
  done
}
