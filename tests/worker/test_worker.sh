#!/usr/bin/env bash
# k3worker end to end against the real daemon: restore = recompute.
# usage: test_worker.sh BUILD_DIR SRC_DIR
set -u
build=$1 src=$2
daemon=$build/daemon/k3cached ctl=$build/client/k3cachectl
worker=$build/tools/k3worker mutant=$build/tools/k3worker_mutant corrupt=$build/tests/k3corrupt
conv=$src/tests/worker/conversation.txt
dir=$(mktemp -d /tmp/k3worker-test-XXXXXX)
sock=$dir/k3cached.sock
export K3CACHE_SOCKET=$sock
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
pass=0 fail=0
ok() { if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }
start() {
  "$daemon" --db "$dir/db" --socket "$sock" --log-level warn 2>>"$dir/log" &
  pid=$!
  for _ in $(seq 100); do "$ctl" ping >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "daemon did not start"; exit 1
}
answers() { grep -E '^(== turn|logits|reply)' "$1"; }
reuse_of() { grep '^\[PREFIX\]' "$1" | sed -n "${2}p" | awk '{print $3}'; }
# runs each turn of FILE in a fresh process: run_turns OUT FILE ARGS...
run_turns() {
  local out=$1 file=$2; shift 2
  local n; n=$(awk 'BEGIN{RS=""} END{print NR}' "$file")
  grep -q '^System:' "$file" && n=$((n - 1))
  rm -f "$out.replies"; : > "$out"
  for k in $(seq "$n"); do "$worker" --conversation "$file" --turn "$k" --replies "$out.replies" "$@" >> "$out" 2>>"$out.err"; done
}

start
# --print-spec is the spec the worker puts: added first (as an admin does for
# workers that are not admins), the worker's run adds no other model
"$worker" --model twin --seed 77 --print-spec > "$dir/twin77.json"
out=$("$ctl" model add "$dir/twin77.json")
ok "model add of k3worker --print-spec ($out)" $(grep -q '^added [0-9a-f]\{64\} (k3worker-twin)$' <<<"$out"; echo $?)
"$worker" --model twin --seed 77 --prompt "a prompt" > "$dir/twin77.out" 2>&1
out=$("$ctl" models)
ok "the worker's own model is the one added, not another ($out)" \
  $([ "$(grep -c '^k3worker-' <<<"$out")" = 1 ] && grep -q '^k3worker-twin  *seed-77 ' <<<"$out" && ! grep -q 'warning' "$dir/twin77.out"; echo $?)
# a worker that is no admin, its model not in the store: the warning says how
# an admin adds it (as root only: it runs the worker as nobody)
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
  chmod 755 "$dir"; chmod 666 "$sock"
  err=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$worker" --model tiny --seed 78 --prompt hi 2>&1 >/dev/null)
  chmod 700 "$dir"
  ok "a worker that is no admin is told how its model is added ($err)" \
    $(grep -qF 'An admin adds this model with: k3worker --model tiny --seed 78 --print-spec > k3worker-tiny-seed78.json && k3cachectl model add k3worker-tiny-seed78.json' <<<"$err"; echo $?)
fi
"$worker" --conversation "$conv" --no-cache > "$dir/ref" 2>"$dir/ref.err"; ok "reference run" $?
ok "reference recomputes every turn" $([ "$(grep -c 'reusing 0 of' "$dir/ref")" = 4 ]; echo $?)

# ---- identity: every turn in a fresh process, chunks of 1, 7 and 64 ---------
for chunk in 1 7 64; do
  run_turns "$dir/c$chunk" "$conv" --chunk "$chunk" --salt "chunk$chunk"
  diff <(answers "$dir/ref") <(answers "$dir/c$chunk") >/dev/null
  ok "chunk $chunk: every turn's logits digest and reply equal --no-cache" $?
  for k in 2 3 4; do
    r=$(reuse_of "$dir/c$chunk" "$k")
    ok "chunk $chunk: turn $k reuses the previous turn ($r tokens)" $([ "${r:-0}" -gt 100 ]; echo $?)
  done
  ok "chunk $chunk: no warnings" $([ ! -s "$dir/c$chunk.err" ]; echo $?)
done

# turns share their MLA rows: inspect, ls and stat show it
key2=$(grep 'end-of-turn snapshot at' "$dir/c64" | sed -n 2p | grep -o 'key [0-9a-f]*' | cut -d' ' -f2)
out=$("$ctl" inspect "${key2:0:12}")
ok "inspect: turn 2 holds MLA rows in shared blocks" $(grep -Eq '^mla rows +[1-9][0-9]* of [0-9]+ in shared blocks' <<<"$out"; echo $?)
out=$("$ctl" --json inspect "${key2:0:12}")
ok "inspect --json: own bytes under the whole" $(python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if 0 < d["stored"] < d["bytes"] and d["shared_rows"] > 0 else 1)' <<<"$out"; echo $?)
ok "ls: an OWN column" $("$ctl" ls | head -1 | grep -q ' OWN '; echo $?)
out=$("$ctl" --json stat)
ok "stat: stored bytes under the logical bytes, blocks counted" $(python3 -c 'import json,sys; d=json.load(sys.stdin); c=d.get("counters", d); sys.exit(0 if c["blocks"] > 0 and c["bytes"] < c["logical_bytes"] else 1)' <<<"$out"; echo $?)

# --turn K without --replies regenerates the earlier replies quietly
"$worker" --conversation "$conv" --turn 3 --salt chunk64 > "$dir/t3" 2>&1
diff <(answers "$dir/ref" | sed -n '7,9p') <(answers "$dir/t3") >/dev/null
ok "--turn 3 alone (no --replies) answers identically" $?

# ---- restart: SIGKILL after turn 2, turn 3 still reuses turn 2 --------------
rm -f "$dir/r.replies"
for k in 1 2; do "$worker" --conversation "$conv" --turn $k --replies "$dir/r.replies" --salt restart >> "$dir/r" 2>&1; done
p2=$(grep 'end-of-turn snapshot at' "$dir/r" | tail -1 | grep -o 'at [0-9]*' | grep -o '[0-9]*')
kill -9 "$pid"; wait "$pid" 2>/dev/null; pid=
start
"$worker" --conversation "$conv" --turn 3 --replies "$dir/r.replies" --salt restart > "$dir/r3" 2>&1
ok "after SIGKILL and restart, turn 3 reuses turn 2's $p2 tokens" $([ "$(reuse_of "$dir/r3" 1)" = "$p2" ]; echo $?)
diff <(answers "$dir/ref" | sed -n '7,9p') <(answers "$dir/r3") >/dev/null
ok "after the restart turn 3's output is identical" $?

# ---- sharing: two conversations behind the same long system prompt ----------
sys_len=$(( $(head -1 "$conv" | wc -c) ))
cat > "$dir/convB" <<'EOT'
System: You are k3, a careful assistant for an inference fleet. Answer briefly and exactly; when unsure, say so. Never invent numbers.

Hello! Tell me about LMDB in one line.
EOT
cat > "$dir/convC" <<'EOT'
System: You are k3, a careful assistant for an inference fleet. Answer briefly and exactly; when unsure, say so. Never invent numbers.

Hello! Tell me about libevent in one line.
EOT
"$worker" --conversation "$dir/convB" --salt share-none --no-cache > "$dir/Bref" 2>/dev/null
"$worker" --conversation "$dir/convC" --salt share-none --no-cache > "$dir/Cref" 2>/dev/null
"$worker" --conversation "$conv" --turn 1 --replies "$dir/A.replies" --salt share > /dev/null 2>&1
"$worker" --conversation "$dir/convB" --salt share > "$dir/B" 2>&1
rB=$(reuse_of "$dir/B" 1)
ok "the second worker reuses at least the system prompt ($rB >= $sys_len)" $([ "$rB" -ge "$sys_len" ]; echo $?)
diff <(answers "$dir/Bref") <(answers "$dir/B") >/dev/null; ok "and answers identically" $?
ok "it saved a junction snapshot where the prompts branch" $(grep -q 'published junction snapshot' "$dir/B"; echo $?)
"$worker" --conversation "$dir/convC" --salt share > "$dir/C" 2>&1
rC=$(reuse_of "$dir/C" 1); j=$(grep 'junction snapshot at' "$dir/B" | grep -o 'at [0-9]*' | grep -o '[0-9]*')
ok "a third worker reuses the junction ($rC >= $j)" $([ "$rC" -ge "$j" ] && [ "$j" -gt "$sys_len" ]; echo $?)
diff <(answers "$dir/Cref") <(answers "$dir/C") >/dev/null; ok "and answers identically" $?

# ---- faults: each a miss or a recompute, never another answer ---------------
K3CACHE_SOCKET=$dir/nowhere.sock "$worker" --conversation "$conv" > "$dir/down" 2> "$dir/down.err"
ok "daemon down: runs" $?
ok "daemon down: one warning line" $([ "$(grep -c warning "$dir/down.err")" = 1 ]; echo $?)
diff <(answers "$dir/ref") <(answers "$dir/down") >/dev/null; ok "daemon down: identical answers" $?

"$worker" --conversation "$conv" --seed 2 --no-cache > "$dir/seed2ref" 2>/dev/null
run_turns "$dir/seed2" "$conv" --seed 2 --salt chunk64
ok "another weight seed: turn 1 misses the seed-1 entries" $([ "$(reuse_of "$dir/seed2" 1)" = 0 ]; echo $?)
diff <(answers "$dir/seed2ref") <(answers "$dir/seed2") >/dev/null; ok "another weight seed: identical to its own recompute" $?
! diff -q <(answers "$dir/ref") <(answers "$dir/seed2") >/dev/null; ok "another weight seed is another model" $?

# an entry corrupted on disk: turn 1's end-of-turn snapshot, under its own salt
rm -f "$dir/x.replies"
"$worker" --conversation "$conv" --turn 1 --replies "$dir/x.replies" --salt corrupt > "$dir/x1" 2>&1
key=$(grep 'end-of-turn snapshot at' "$dir/x1" | grep -o 'key [0-9a-f]*' | cut -d' ' -f2)
kill -TERM "$pid"; wait "$pid" 2>/dev/null; pid=
"$corrupt" "$dir/db" "$key" >/dev/null; ok "corrupted the latest entry on disk" $?
out=$("$ctl" --db "$dir/db" verify); rc=$?
ok "--db verify finds the damage (exit 1)" $([ $rc = 1 ] && grep -q "DAMAGED ${key:0:16}" <<<"$out"; echo $?)
ok "--db verify says it did not quarantine, and what to run" $(! grep -q 'the entry is quarantined' <<<"$out" && grep -q 'read-only.*k3cachectl verify' <<<"$out"; echo $?)
out=$("$ctl" --db "$dir/db" inspect "${key:0:12}" 2>&1); ok "--db inspect: still not quarantined" $(! grep -q QUARANTINED <<<"$out"; echo $?)
ok "--db inspect: does not claim a quarantine it cannot do" $(! grep -q 'is quarantined' <<<"$out" && grep -q 'read-only' <<<"$out"; echo $?)
out=$("$ctl" --db "$dir/db" export "${key:0:12}" -o "$dir/x.k3snap" 2>&1)
ok "--db export: the same" $(! grep -q 'is quarantined' <<<"$out" && grep -q 'read-only' <<<"$out"; echo $?)
start
"$worker" --conversation "$conv" --turn 2 --replies "$dir/x.replies" --salt corrupt > "$dir/x2" 2> "$dir/x2.err"
ok "corrupt entry: one warning, recomputed" $([ "$(grep -c 'warning' "$dir/x2.err")" = 1 ] && grep -q 'CORRUPT' "$dir/x2.err"; echo $?)
diff <(answers "$dir/ref" | sed -n '4,6p') <(answers "$dir/x2") >/dev/null; ok "corrupt entry: identical answer" $?
out=$("$ctl" inspect "${key:0:12}"); ok "the corrupt entry is quarantined" $(grep -q QUARANTINED <<<"$out"; echo $?)

# an entry whose chunk is gone: the restore fails on the daemon's loop thread,
# which takes no write transaction; the writer quarantines it
rm -f "$dir/y.replies"
"$worker" --conversation "$conv" --turn 1 --replies "$dir/y.replies" --salt dropped > "$dir/y1" 2>&1
key=$(grep 'end-of-turn snapshot at' "$dir/y1" | grep -o 'key [0-9a-f]*' | cut -d' ' -f2)
kill -TERM "$pid"; wait "$pid" 2>/dev/null; pid=
"$corrupt" "$dir/db" "$key" drop >/dev/null; ok "deleted the latest entry's first chunk" $?
start
"$worker" --conversation "$conv" --turn 2 --replies "$dir/y.replies" --salt dropped > "$dir/y2" 2> "$dir/y2.err"
ok "missing chunk: one warning, recomputed" $([ "$(grep -c 'warning' "$dir/y2.err")" = 1 ] && grep -q 'chunk 0 is missing' "$dir/y2.err"; echo $?)
diff <(answers "$dir/ref" | sed -n '4,6p') <(answers "$dir/y2") >/dev/null; ok "missing chunk: identical answer" $?
out=$("$ctl" inspect "${key:0:12}"); ok "the entry missing a chunk is quarantined" $(grep -q QUARANTINED <<<"$out"; echo $?)

# ---- the seed's mutants, caught end to end -----------------------------------
"$mutant" --mutant banana --conversation "$conv" --turn 1 >/dev/null 2>"$dir/mb.err"
ok "--mutant banana: exit 2, names the choices" $([ $? = 2 ] && grep -q 'slot or row' "$dir/mb.err"; echo $?)
for m in slot row; do
  rm -f "$dir/m.replies"
  for k in 1 2 3; do "$mutant" --mutant $m --conversation "$conv" --turn $k --replies "$dir/m.replies" --salt "mut$m" >> "$dir/m$m" 2>&1; done
  r=$(reuse_of "$dir/m$m" 2)
  ! diff -q <(answers "$dir/ref" | head -9) <(answers "$dir/m$m") >/dev/null
  ok "mutant $m (restored $r tokens) fails the identity test" $?
done

echo "$pass passed, $fail failed"
[ $fail = 0 ]
