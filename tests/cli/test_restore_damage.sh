#!/usr/bin/env bash
# A restore never sends bytes the daemon knows are bad: a chunk found damaged
# before any byte of the answer went out is answered CORRUPT with no payload;
# one found later ends the connection mid-payload (an error for the client,
# never an OK with bad bytes). Either way the entry is quarantined and every
# later restore of it answers CORRUPT, not NOT_FOUND; other entries are
# served as before. A restore cut short keeps its read transaction until the
# chunks queued before the cut are gone.
# usage: test_restore_damage.sh K3CACHED K3CACHECTL K3PUB K3CORRUPT SHARED_DIR FAULT_SNDBUF_SO
set -u
daemon=$1 ctl=$2 pub=$3 corrupt=$4 shared=$5 fault_sndbuf=$6
dir=$(mktemp -d /tmp/k3damage-test-XXXXXX)
# KDA layers of 2 MiB: an entry of ~38 MiB is ~38 chunks of its own
spec=$dir/big-kda.json
{
  printf '{"name":"big-kda","revision":"1","state_layout":"test","layers":['
  for i in $(seq 19); do printf '{"mixer":"kda","conv_len":262144,"recurrent_len":262144},'; done
  printf '{"mixer":"mla","k_row":4,"v_row":4}]}'
} > "$spec"
sock=$dir/k3.sock
. "$(dirname "$0")/daemon_lib.sh"
sent() { "$ctl" --socket "$sock" --json stat | sed -n 's/.*"bytes_out": *\([0-9]*\).*/\1/p'; }
restore() { "$ctl" --socket "$sock" export "$1" -o "$dir/out.k3snap" >"$dir/r.out" 2>&1; }
keep=${KEEP:-}

start
# entries of 64 tokens (one of 40), 38 MiB each
early=$("$pub" "$sock" "$spec" N:64 early 1 | tail -1)
late=$("$pub" "$sock" "$spec" N:64 late 2 | tail -1)
good=$("$pub" "$sock" "$spec" N:64 good 3 | tail -1)
cut=$("$pub" "$sock" "$spec" N:64 cut 4 | tail -1)
# under a row block (64): no shared block names its rows by its tokens' hash
toks=$("$pub" "$sock" "$spec" N:40 toks 5 | tail -1)
size=$("$ctl" --socket "$sock" --json inspect "${good:0:16}" | sed -n 's/.*"bytes": *\([0-9]*\).*/\1/p' | head -1)
ok "published three entries" $([ ${#early} = 64 ] && [ ${#late} = 64 ] && [ ${#good} = 64 ] && [ "${size:-0}" -gt 30000000 ]; echo $?)
stop
"$corrupt" "$dir/db" "$early" flip 0 >/dev/null; ok "damaged chunk 0 of one entry" $?
"$corrupt" "$dir/db" "$late" flip 30 >/dev/null; ok "damaged chunk 30 of another" $?
"$corrupt" "$dir/db" "$cut" flip 30 >/dev/null; ok "damaged chunk 30 of a third" $?
"$corrupt" "$dir/db" "$toks" tokens >/dev/null; ok "damaged the token list of a fourth" $?
start

# an entry whose tokens no longer hash to its key: export writes no file
# that import would refuse
rm -f "$dir/out.k3snap"
restore "${toks:0:16}"; rc=$?
ok "damaged tokens: export fails (exit $rc)" $([ $rc = 1 ]; echo $?)
ok "damaged tokens: it says why: $(head -c 300 "$dir/r.out")" $(grep -q 'do not hash to its key' "$dir/r.out"; echo $?)
ok "damaged tokens: no file is written" $([ ! -e "$dir/out.k3snap" ]; echo $?)

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

# (the daemon again, its send buffers 64 KiB whatever this host allows, so
# that its writes fall short and its output stays queued, as on a host whose
# net.core.wmem_max is small: a fake setsockopt, test-only; an ASan daemon
# wants its runtime first, the fake may come before it)
stop
LD_PRELOAD=$fault_sndbuf K3FAULT_SNDBUF=65536 ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0 start
# a restore cut short keeps its snapshot (its read transaction) while the
# chunks queued before the cut wait to be sent: they point into the map, and
# must not go out from pages the writer has reused. A client reads the
# answer 64 KiB at a time until the daemon logs the cut (at chunk 30), then
# reads nothing; the writer checks the entry (quarantined), and the restore
# still counts as streaming until the connection goes. Before, its snapshot
# went with the writer's check.
streaming() { "$ctl" --socket "$sock" --json stat | sed -n 's/.*"restores_streaming": *\([0-9]*\).*/\1/p'; }
python3 - "$sock" "$cut" "$dir/log" > "$dir/cut.out" <<'PY' &
import socket, struct, sys, time
sock, key, log = sys.argv[1], bytes.fromhex(sys.argv[2]), sys.argv[3]
cuts = lambda: open(log).read().count("closing the connection")
before = cuts()
s = socket.socket(socket.AF_UNIX)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
s.connect(sock)
hdr = b"\x08\x01\x72\x22\x0a\x20" + key  # Request{id 1, Restore{key}}
s.sendall(struct.pack("<I", len(hdr)) + hdr)
got = 0
while cuts() == before:
    b = s.recv(65536)
    if not b:
        break
    got += len(b)
print(got, flush=True)
time.sleep(60)  # reads nothing more; the test kills it
PY
cpid=$!
for _ in $(seq 400); do [ -s "$dir/cut.out" ] && break; sleep 0.05; done
sleep 1 # the writer's check of the entry is done by now
held=$(streaming)
ok "a cut restore: its client read $(cat "$dir/cut.out") bytes until the cut, and its snapshot is held while chunks wait to be sent (restores_streaming $held)" $([ "$(cat "$dir/cut.out")" -gt $((20 << 20)) ] && [ "$held" = 1 ] && grep -q "${cut:0:16}.*quarantined\|quarantined" "$dir/log"; echo $?)
kill "$cpid"; wait "$cpid" 2>/dev/null
for _ in $(seq 100); do [ "$(streaming)" = 0 ] && break; sleep 0.05; done
ok "a cut restore: its snapshot goes with the connection" $([ "$(streaming)" = 0 ]; echo $?)
"$ctl" --socket "$sock" ping >/dev/null; ok "the daemon is up" $?
stop
echo "$pass passed, $fail failed"
[ $fail = 0 ]
