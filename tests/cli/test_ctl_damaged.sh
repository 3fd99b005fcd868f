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
. "$(dirname "$0")/daemon_lib.sh"
c() { "$ctl" --socket "$sock" "$@"; }

start
c model add "$tiny" >/dev/null && c model add "$twin" >/dev/null
# a model no entry uses yet (added by root before its workers, tenants,
# publish: they may not add one)
sed 's/"tiny-hybrid"/"unused-yet"/' "$tiny" > "$dir/unused.json"
c model add "$dir/unused.json" >/dev/null
bad=$("$pub" "$sock" "$tiny" 1,2,3,4,5)
good=$("$pub" "$sock" "$twin" N:40)
sound=$("$pub" "$sock" "$tiny" 7,8,9)  # its bytes stay whole; its spec will not
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

# one model's spec damaged on disk (its name changed: it no longer hashes to
# its fingerprint): the other model and its entries are as good as before
python3 - "$dir/db/data.mdb" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
at = b.find(b'"name":"tiny-hybrid"')
while at >= 0:  # every copy: LMDB leaves old ones in free pages
    b[at + 8] = ord("T")
    at = b.find(b'"name":"tiny-hybrid"', at + 1)
open(p, "wb").write(b)
PY
for mode in db daemon; do
  if [ $mode = db ]; then cc() { "$ctl" --db "$dir/db" "$@"; }; else start; cc() { c "$@"; }; fi
  out=$(cc models 2>&1); rc=$?
  ok "$mode: models lists the sound spec ($out)" $(grep -q '^kimi-k3-0.40b-twin ' <<<"$out"; echo $?)
  ok "$mode: says a spec is damaged, exits 1 (rc $rc)" $([ $rc = 1 ] && grep -q 'damaged' <<<"$out"; echo $?)
  rm -f "$dir/good.snap"
  out=$(cc export "${good:0:16}" -o "$dir/good.snap" 2>&1); rc=$?
  ok "$mode: export of the sound model's entry (rc $rc: $out)" $([ $rc = 0 ] && [ -s "$dir/good.snap" ]; echo $?)
  out=$(cc ls --model kimi-k3-0.40b-twin 2>&1); rc=$?
  ok "$mode: ls --model of the sound model (rc $rc: $out)" $([ $rc = 0 ] && grep -q '^1 entry' <<<"$out"; echo $?)
  out=$(cc inspect "${good:0:16}" 2>&1); rc=$?
  ok "$mode: inspect validates the sound model's layers (rc $rc)" $([ $rc = 0 ] && [ "$(grep -c ' yes$' <<<"$out")" = 8 ]; echo $?)
  # the damaged spec's entries are still found by its fingerprint
  out=$(cc evict --model c67bf269b47a8bcd6adc637780f384ef63a302e0d9d6541c5bc7886a5f84f2e6 --dry-run 2>&1); rc=$?
  ok "$mode: evict --model FP --dry-run finds the damaged spec's entries (rc $rc: $out)" $([ $rc = 0 ] && grep -q '^would evict 2 entries' <<<"$out"; echo $?)
  # verify says the spec is damaged: salvage would lose its model's entries
  out=$(cc verify 2>&1); rc=$?
  ok "$mode: verify names the damaged spec, exits 1 (rc $rc: $out)" $([ $rc = 1 ] && grep -q '^STORE .*model spec c67bf269.* is damaged' <<<"$out"; echo $?)
done
n=$(c --json stat | sed -n 's/.*"models_damaged": *\([0-9]*\).*/\1/p')
ok "the damaged spec is counted (models_damaged $n)" $([ "${n:-0}" -ge 1 ]; echo $?)
stop
# salvage cannot save an entry whose spec is damaged: it says that, not
# that the model is missing
out=$("$ctl" --db "$dir/db" salvage --to "$dir/new" 2>&1); rc=$?
ok "salvage names the damaged spec as the loss of ${sound:0:16} (rc $rc: $out)" $([ $rc = 0 ] && grep -q "^LOST ${sound:0:16}  its model spec is damaged" <<<"$out"; echo $?)
ok "and saves the sound model's entry" $(grep -q '^saved 1 of 3 entries' <<<"$out"; echo $?)
out=$("$ctl" --db "$dir/new" models 2>&1); rc=$?
ok "and every sound spec, used or not (rc $rc: $out)" $([ $rc = 0 ] && grep -q '^unused-yet ' <<<"$out" && grep -q '^kimi-k3-0.40b-twin ' <<<"$out" && grep -q '^2 models' <<<"$out"; echo $?)

# salvage reads DIR without writing it: an entry it cannot save is reported
# as found, never as "quarantined" (nothing of DIR is)
mv "$dir/db" "$dir/db.old"
start
c model add "$tiny" >/dev/null
flipped=$("$pub" "$sock" "$tiny" 4,3,2,1)
dropped=$("$pub" "$sock" "$tiny" 5,6,7,8)
stop
"$corrupt" "$dir/db" "$flipped" flip 0 >/dev/null && "$corrupt" "$dir/db" "$dropped" drop 0 >/dev/null
ok "damaged two fresh entries" $?
out=$("$ctl" --db "$dir/db" salvage --to "$dir/new2" 2>&1); rc=$?
ok "salvage: the flipped chunk is named (rc $rc: $out)" $([ $rc = 0 ] && grep -q "^LOST ${flipped:0:16}  chunk 0 .*fails its checksum" <<<"$out"; echo $?)
ok "salvage: the dropped chunk is named" $(grep -q "^LOST ${dropped:0:16}  chunk 0 is missing" <<<"$out"; echo $?)
ok "salvage: nothing is said to be quarantined" $(! grep -qi 'quarantin' <<<"$out"; echo $?)

echo "$pass passed, $fail failed"
[ $fail = 0 ]
