#!/usr/bin/env bash
# A restore never sends bytes the daemon knows are bad: a chunk found damaged
# before any byte of the answer went out is answered CORRUPT with no payload;
# one found later ends the connection mid-payload (an error for the client,
# never an OK with bad bytes). Either way the entry is quarantined and every
# later restore of it answers CORRUPT, not NOT_FOUND; other entries are
# served as before.
# usage: test_restore_damage.sh K3CACHED K3CACHECTL K3PUB K3CORRUPT SHARED_DIR
set -u
daemon=$1 ctl=$2 pub=$3 corrupt=$4 shared=$5
dir=$(mktemp -d /tmp/k3damage-test-XXXXXX)
# KDA layers of 2 MiB: an entry of ~38 MiB is ~38 chunks of its own
spec=$dir/big-kda.json
{
  printf '{"name":"big-kda","revision":"1","state_layout":"test","layers":['
  for i in $(seq 19); do printf '{"mixer":"kda","conv_len":262144,"recurrent_len":262144},'; done
  printf '{"mixer":"mla","k_row":4,"v_row":4}]}'
} > "$spec"
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
sent() { "$ctl" --socket "$sock" --json stat | sed -n 's/.*"bytes_out": *\([0-9]*\).*/\1/p'; }
restore() { "$ctl" --socket "$sock" export "$1" -o "$dir/out.k3snap" >"$dir/r.out" 2>&1; }
keep=${KEEP:-}

start
# three entries of 64 tokens, 38 MiB each
early=$("$pub" "$sock" "$spec" N:64 early 1 | tail -1)
late=$("$pub" "$sock" "$spec" N:64 late 2 | tail -1)
good=$("$pub" "$sock" "$spec" N:64 good 3 | tail -1)
size=$("$ctl" --socket "$sock" --json inspect "${good:0:16}" | sed -n 's/.*"bytes": *\([0-9]*\).*/\1/p' | head -1)
ok "published three entries" $([ ${#early} = 64 ] && [ ${#late} = 64 ] && [ ${#good} = 64 ] && [ "${size:-0}" -gt 30000000 ]; echo $?)
stop
"$corrupt" "$dir/db" "$early" flip 0 >/dev/null; ok "damaged chunk 0 of one entry" $?
"$corrupt" "$dir/db" "$late" flip 30 >/dev/null; ok "damaged chunk 30 of another" $?
start

# damage found before anything went out: CORRUPT, no payload
b0=$(sent)
restore "${early:0:16}"; rc=$?
b1=$(sent)
ok "early damage: the restore fails" $([ $rc != 0 ]; echo $?)
ok "early damage: answered CORRUPT" $(grep -q CORRUPT "$dir/r.out"; echo $?)
ok "early damage: no payload went out ($((b1 - b0)) bytes)" $([ $((b1 - b0)) -lt 65536 ]; echo $?)

# damage found mid-send: the connection ends before the damaged chunk
b0=$(sent)
restore "${late:0:16}"; rc=$?
b1=$(sent)
ok "late damage: the restore fails" $([ $rc != 0 ]; echo $?)
ok "late damage: the answer stops before the damaged chunk ($((b1 - b0)) of $size bytes)" \
  $([ $((b1 - b0)) -lt $((31 * 1048576)) ]; echo $?)
ok "late damage: the daemon says it closed the connection" $(grep -q 'chunk 30 fails its checksum' "$dir/log" && grep -q 'closing the connection' "$dir/log"; echo $?)

# quarantined: CORRUPT from now on, not NOT_FOUND; the others still served
sleep 0.5 # the writer quarantines
for k in "$early" "$late"; do
  restore "${k:0:16}"; rc=$?
  ok "then ${k:0:8}: CORRUPT, quarantined" $([ $rc != 0 ] && grep -q CORRUPT "$dir/r.out" && grep -q quarantined "$dir/r.out" && ! grep -q NOT_FOUND "$dir/r.out"; echo $?)
done
out=$("$ctl" --socket "$sock" inspect "${late:0:16}"); ok "inspect shows the quarantine" $(grep -q QUARANTINED <<<"$out"; echo $?)
restore "${good:0:16}"; ok "the undamaged entry restores" $?
"$ctl" --socket "$sock" ping >/dev/null; ok "the daemon is up" $?
stop
echo "$pass passed, $fail failed"
[ $fail = 0 ]
