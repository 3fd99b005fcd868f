#!/usr/bin/env bash
# k3cachectl on a store whose bytes a bad disk changed: each command says
# what it found and exits non-zero, never 0 with what it could not check.
# usage: test_ctl_damaged.sh K3CACHED K3CACHECTL K3PUB K3CORRUPT SHARED_DIR
set -u
daemon=$1 ctl=$2 pub=$3 corrupt=$4 shared=$5
tiny=$shared/models/tiny-hybrid.json
twin=$shared/models/kimi-k3-0.40b-twin.json
dir=$(mktemp -d /tmp/k3ctl-damaged-XXXXXX)
sock=$dir/k3.sock
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$dir"; }
trap cleanup EXIT
pass=0 fail=0
ok() { if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }
start() {
  "$daemon" --db "$dir/db" --socket "$sock" --log-level info 2>>"$dir/log" &
  pid=$!
  for _ in $(seq 100); do "$ctl" --socket "$sock" ping >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "daemon did not start"; cat "$dir/log"; exit 1
}
stop() { kill -TERM "$pid"; wait "$pid" 2>/dev/null; pid=; }
c() { "$ctl" --socket "$sock" "$@"; }

start
c model add "$tiny" >/dev/null && c model add "$twin" >/dev/null
bad=$("$pub" "$sock" "$tiny" 1,2,3,4,5)
good=$("$pub" "$sock" "$twin" N:40)
ok "published two entries" $([ ${#bad} = 64 ] && [ ${#good} = 64 ]; echo $?)
stop
"$corrupt" "$dir/db" "$bad" flip 0 >/dev/null; ok "damaged a chunk of one" $?

# inspect reads the layers to say whether each verifies: when they cannot
# be read (a chunk fails its checksum) it must not exit 0 as if all were well
out=$("$ctl" --db "$dir/db" inspect "${bad:0:16}" 2>&1); rc=$?
ok "--db inspect of a damaged entry exits 1 (rc $rc)" $([ $rc = 1 ]; echo $?)
ok "and says why: $(tail -1 <<<"$out")" $(grep -q 'CORRUPT' <<<"$out"; echo $?)
start
out=$(c inspect "${bad:0:16}" 2>&1); rc=$?
ok "inspect of a damaged entry exits 1 (rc $rc)" $([ $rc = 1 ]; echo $?)
ok "and says why" $(grep -q 'CORRUPT' <<<"$out"; echo $?)
out=$(c inspect "${good:0:16}" 2>&1); rc=$?
ok "inspect of the other entry exits 0 (rc $rc)" $([ $rc = 0 ] && [ "$(grep -c ' yes$' <<<"$out")" = 8 ]; echo $?)
stop

echo "$pass passed, $fail failed"
[ $fail = 0 ]
