#!/usr/bin/env bash
# The daemon short of memory: one of its allocations fails, the 1st, the
# (1 + STRIDE)th, the (1 + 2 STRIDE)th ... of what a round of clients makes it
# do (a publish streamed through the receive window, a lookup and restore
# checked byte for byte, stat, ls, inspect, verify (and --json), evict: about 1,150
# allocations), until one past the round's last; one daemon throughout. After each round
# the daemon must still be up and serve the entry it held, byte for byte; no
# client may hang or be answered OK with wrong bytes, and no answer may call
# the failure something else (too large). A fake allocator (fault_alloc.c,
# LD_PRELOAD) gives the failure; skipped (77) under ASan, which owns malloc.
# The default STRIDE, 1, tries every allocation (about 35 s here).
# usage: test_daemon_oom.sh K3CACHED K3CACHECTL K3PUB SHARED FAULT_ALLOC_SO [STRIDE]
set -u
daemon=$1 ctl=$2 pub=$3 shared=$4 fault=$5 stride=${6:-1}
max=100000
if ldd "$daemon" | grep -q libasan; then
  echo "skipped: the ASan build owns malloc"
  exit 77
fi
tiny=$shared/models/tiny-hybrid.json
dir=$(mktemp -d /tmp/k3oom-test-XXXXXX)
sock=$dir/k3.sock
arm=$dir/arm
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$dir"; }
trap cleanup EXIT
pass=0 fail=0
ok() { if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }
c() { timeout 20 "$ctl" --socket "$sock" "$@"; }

# a publish of 2,000 tokens (80 KB of MLA rows) is streamed through the
# receive window of 64 KiB stages
LD_PRELOAD=$fault K3FAULT_ALLOC_ARM=$arm "$daemon" --db "$dir/db" --socket "$sock" \
  --stage-size 64KiB --log-level info 2>>"$dir/log" &
pid=$!
for _ in $(seq 100); do c ping >/dev/null 2>&1 && break; sleep 0.05; done
c model add "$tiny" >/dev/null; ok "the daemon runs with the fake allocator" $?
base=$(timeout 20 "$pub" "$sock" "$tiny" N:300 held 1 | tail -1)
ok "an entry to hold" $([ ${#base} = 64 ]; echo $?)
# the held entry, restored and compared with what was published
held() { timeout 20 "$pub" "$sock" "$tiny" N:300 held 1 --restore >"$dir/held.out" 2>&1; }

failed_at=() wrong=0 hung=0 down=0 crashed=0 blamed=0 nojson=0
# a client's exit and output: hung (timeout), crashed (a signal), or told
# the daemon broke the protocol
seen() {
  if [ "$1" = 124 ]; then hung=$((hung + 1)); echo "round $n: $2 hung"
  elif [ "$1" -ge 128 ]; then crashed=$((crashed + 1)); echo "round $n: $2 died ($1)"; fi
  if grep -qE 'out of step|does not decode|bad frame' "$3"; then
    blamed=$((blamed + 1)); echo "round $n: $2: $(head -c 300 "$3")"
  fi
}
for n in $(seq 1 "$stride" "$max"); do
  rm -f "$arm.hit"
  echo "$n $n" >"$arm"
  timeout 20 "$pub" "$sock" "$tiny" N:2000 "round-$n" "$n" >"$dir/pub.out" 2>&1
  seen $? publish "$dir/pub.out"
  held
  seen $? restore "$dir/held.out"
  if grep -q 'differ' "$dir/held.out"; then wrong=$((wrong + 1)); echo "round $n: wrong bytes"; fi
  for cmd in stat ls "inspect ${base:0:16}" verify; do
    # shellcheck disable=SC2086
    c $cmd >"$dir/c.out" 2>&1
    seen $? "$cmd" "$dir/c.out"
  done
  # a verify that stops (its answer an error code) says so in its JSON
  # too, beside what it had found
  c verify --json >"$dir/v.json" 2>"$dir/v.err"
  vrc=$?
  seen $vrc "verify --json" "$dir/v.err"
  if grep -qE '^k3cachectl verify: [A-Z_]+: ' "$dir/v.err" && ! python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
sys.exit(0 if d.get("error", {}).get("code") or d["damaged"] else 1)' "$dir/v.json" 2>/dev/null; then
    nojson=$((nojson + 1))
    echo "round $n: verify --json exited $vrc with no error in its JSON: $(head -c 300 "$dir/v.json") $(head -c 300 "$dir/v.err")"
  fi
  rm -f "$arm"
  key=$(tail -1 "$dir/pub.out")
  [ ${#key} = 64 ] && c evict "$key" >/dev/null 2>&1 # the store stays the same size
  if ! kill -0 "$pid" 2>/dev/null; then
    down=1
    echo "round $n: the daemon died"
    tail -5 "$dir/log"
    break
  fi
  if ! held; then
    echo "round $n: the held entry is no longer served: $(cat "$dir/held.out")"
    wrong=$((wrong + 1))
  fi
  [ -e "$arm.hit" ] || break # a round that failed nothing: every allocation was tried
  failed_at+=("$n")
done
echo "${#failed_at[@]} rounds each failed one allocation, 1 in $stride, up to the ${failed_at[-1]:-0}th"
ok "one in $stride allocations of the round was failed, to its end (${#failed_at[@]} rounds)" \
  $([ $((${#failed_at[@]} * stride)) -gt 500 ] && [ $((${#failed_at[@]} * stride)) -lt "$max" ]; echo $?)
# every request here is valid and small: an answer saying otherwise
# mistook the daemon's want of memory for the client's fault
grep -E "header limit|INVALID" "$dir/log" | head -3
grep -qE "header limit|INVALID" "$dir/log"
ok "no failure was answered as the client's fault (INVALID, too large)" $([ $? = 1 ]; echo $?)
ok "the daemon stayed up" $([ $down = 0 ]; echo $?)
ok "no client hung ($hung)" $([ $hung = 0 ]; echo $?)
ok "no client died ($crashed)" $([ $crashed = 0 ]; echo $?)
ok "no client was told the daemon broke the protocol ($blamed)" $([ $blamed = 0 ]; echo $?)
ok "a verify --json that stopped said why in its JSON ($nojson)" $([ $nojson = 0 ]; echo $?)
ok "no wrong bytes, and the held entry always served after ($wrong)" $([ $wrong = 0 ]; echo $?)
kill -TERM "$pid"; wait "$pid"; rc=$?; pid=
ok "SIGTERM stops it cleanly (exit $rc)" $([ $rc = 0 ]; echo $?)
echo "$pass passed, $fail failed"
[ $fail = 0 ]
