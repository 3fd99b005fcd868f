#!/usr/bin/env bash
# k3cachectl against a real daemon and against --db: every command in human
# and JSON form, evict selectors, export/import, a store whose daemon was
# SIGKILLed, and the exit codes.
# usage: test_ctl_daemon.sh K3CACHED K3CACHECTL K3PUB SHARED
set -u
daemon=$1 ctl=$2 pub=$3 shared=$4
tiny=$shared/models/tiny-hybrid.json
twin=$shared/models/kimi-k3-0.40b-twin.json
dir=$(mktemp -d /tmp/k3ctl-test-XXXXXX)
sock=$dir/k3cached.sock
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
pass=0 fail=0
ok() { if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }
start() {
  "$daemon" --db "$dir/db" --socket "$sock" --log-level warn 2>>"$dir/log" &
  pid=$!
  for _ in $(seq 100); do "$ctl" --socket "$sock" ping >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "daemon did not start"; cat "$dir/log"; exit 1
}
c() { "$ctl" --socket "$sock" "$@"; }
json_num() { grep -o "\"$1\": [0-9]*" | head -1 | grep -o '[0-9]*$'; }

start
# ---- models, model add -------------------------------------------------------
out=$(c model add "$tiny"); ok "model add says added" $([[ $out == added\ c67bf269* ]]; echo $?)
out=$(c model add "$tiny"); ok "model add again says exists" $([[ $out == exists* ]]; echo $?)
c model add "$twin" >/dev/null
out=$(c models); ok "models table" $(grep -q '^tiny-hybrid  *fixture-1  *4  *3  *1  *c67bf269' <<<"$out"; echo $?)
out=$(c --json models); ok "models json" $(grep -q '"fingerprint": "f23c9bd4' <<<"$out"; echo $?)
c model add /nonexistent.json >/dev/null 2>&1; ok "model add of a missing file exits 1" $([ $? = 1 ]; echo $?)

# ---- entries -----------------------------------------------------------------
k1=$("$pub" "$sock" "$tiny" 1,2,3,4,5)
k2=$("$pub" "$sock" "$twin" N:40 tenant-a)
k3=$("$pub" "$sock" "$twin" N:20 "" 2)
ok "k3pub keys" $([ ${#k1} = 64 ] && [ ${#k2} = 64 ]; echo $?)
want=$("$ctl" key --model "$tiny" --tokens 1,2,3,4,5)
ok "published key equals the contract key" $([ "$k1" = "$want" ]; echo $?)
# the test helper's own token list: an empty item or junk publishes nothing
for t in 1,,3 ,1 1, 1,x 1,-2 N: N:x N:0x10; do
  "$pub" "$sock" "$tiny" "$t" >/dev/null 2>&1; rc=$?
  ok "k3pub TOKENS '$t' is refused with exit 2 (rc $rc)" $([ $rc = 2 ]; echo $?)
done
"$pub" "$sock" "$tiny" 1,2 "" banana >/dev/null 2>&1; rc=$?
ok "k3pub SEED banana is refused with exit 2 (rc $rc)" $([ $rc = 2 ]; echo $?)
ok "and none of them published" $([ "$(c --json stat | json_num entries)" = 3 ]; echo $?)

out=$(c ls)
ok "ls lists 3 entries" $(grep -q '^3 entries, ' <<<"$out"; echo $?)
ok "ls shows the short key, model, prefix, layers" $(grep -q "^${k2:0:16} kimi-k3-0.40b-twin  *40  *8  *664 KiB" <<<"$out"; echo $?)
out=$(c --json ls)
ok "ls json totals" $([ "$(json_num total_entries <<<"$out")" = 3 ]; echo $?)
ok "ls json has full keys" $(grep -q "\"key\": \"$k1\"" <<<"$out"; echo $?)
out=$(c ls --model tiny-hybrid); ok "ls --model NAME" $(grep -q '^1 entry, 576 B' <<<"$out"; echo $?)
out=$(c ls --model f23c9bd4b1ae22eacce85eaf38ace0658cdfd727de6ee28aa9a4741286bb4f58)
ok "ls --model FP" $(grep -q '^2 entries' <<<"$out"; echo $?)
out=$(c ls --sort len --limit 1); ok "ls --sort len --limit 1" $(grep -q "^${k2:0:16} " <<<"$out" && grep -q '1 of 3 entries shown' <<<"$out"; echo $?)
out=$(c ls --sort size); ok "ls --sort size puts the largest first" $(sed -n 2p <<<"$out" | grep -q "^${k2:0:16}"; echo $?)
c ls --sort bogus >/dev/null 2>&1; ok "ls --sort bogus is a usage error" $([ $? = 2 ]; echo $?)
c ls --model nosuch >/dev/null 2>&1; ok "ls --model unknown exits 4" $([ $? = 4 ]; echo $?)
# a fingerprint no model has (a typo) is not found either, as a name is
nofp=$(printf '0%.0s' $(seq 64))
out=$(c ls --model $nofp 2>&1); rc=$?
ok "ls --model of an unknown fingerprint exits 4 ($out)" $([ $rc = 4 ] && grep -q 'no model has fingerprint' <<<"$out"; echo $?)
out=$(c evict --model $nofp 2>&1); rc=$?
ok "evict --model of an unknown fingerprint exits 4 ($out)" $([ $rc = 4 ] && grep -q 'no model has fingerprint' <<<"$out"; echo $?)

out=$(c inspect "${k2:0:8}")
ok "inspect header" $(grep -q "^key  *$k2" <<<"$out" && grep -q '^prefix  *40 tokens: 1 2 3' <<<"$out" && grep -q '^salt  *8 bytes' <<<"$out"; echo $?)
ok "inspect layer rows verify" $([ "$(grep -c ' yes$' <<<"$out")" = 8 ]; echo $?)
ok "inspect MLA row" $(grep -q '^    3 MLA  *30720  *20480  *40  *204813 ' <<<"$out"; echo $?)
out=$(c inspect "${k2:0:8}" --layer 3 --values)
ok "inspect --layer --values" $([ "$(grep -c ' MLA ' <<<"$out")" = 1 ] && grep -q '^      k  *min ' <<<"$out"; echo $?)
out=$(c --json inspect "$k1" --values)
ok "inspect json" $(grep -q '"prefix_len": 5' <<<"$out" && grep -q '"verifies": "yes"' <<<"$out" && grep -q '"recurrent_values"' <<<"$out"; echo $?)
c inspect 1234 >/dev/null 2>&1; ok "short key prefix is a usage error" $([ $? = 2 ]; echo $?)
c inspect 00000000ffffffff >/dev/null 2>&1; ok "missing key exits 4" $([ $? = 4 ]; echo $?)

out=$(c stat); ok "stat counts entries" $(grep -q '^entries  *3 *$' <<<"$out"; echo $?)
out=$(c --json stat); ok "stat json" $([ "$(json_num publishes <<<"$out")" = 3 ] && [ "$(json_num models <<<"$out")" = 2 ]; echo $?)
# the daemon's version, pid and uptime, as redis-cli INFO shows them; and --version
ver=$("$daemon" --version); ok "k3cached --version ($ver)" $([[ $ver =~ ^k3cached\ [0-9]+\.[0-9]+\.[0-9]+$ ]]; echo $?)
out=$("$ctl" --version); ok "k3cachectl --version ($out)" $([ "$out" = "k3cachectl ${ver#k3cached }" ]; echo $?)
out=$(c stat); ok "stat shows the daemon's version first" $([ "$(head -1 <<<"$out" | tr -s ' ')" = "version $ver" ]; echo $?)
ok "stat shows the daemon's pid" $(grep -q "^pid  *$pid *$" <<<"$out"; echo $?)
out=$(c --json stat); ok "stat json: version, pid, uptime_seconds" $(grep -q "\"version\": \"$ver\"" <<<"$out" && [ "$(json_num pid <<<"$out")" = "$pid" ] && [ -n "$(json_num uptime_seconds <<<"$out")" ]; echo $?)
# stat --interval: a header, then a line every interval (as redis-cli --stat)
out=$(c stat --interval 0.2 --count 3)
ok "stat --interval --count 3: a header and 3 lines" $([ "$(wc -l <<<"$out")" = 4 ] && head -1 <<<"$out" | grep -q 'entries .*hits/s .*publish/s' && sed -n 2p <<<"$out" | grep -q '^ *3 '; echo $?)
out=$(c --json stat --interval 0.2 --count 2)
ok "stat --json --interval: one object a line" $([ "$(grep -c '^{"entries": 3, ' <<<"$out")" = 2 ]; echo $?)
c stat --count 2 >/dev/null 2>&1; ok "stat --count without --interval: usage (2)" $([ $? = 2 ]; echo $?)
out=$(c ping); ok "ping" $(grep -q '^PONG from k3cached' <<<"$out"; echo $?)
out=$(c --json ping); ok "ping json" $(grep -q '"ok": true' <<<"$out"; echo $?)
out=$(c verify); ok "verify clean" $([ "$out" = "verified 3 entries: 0 damaged" ]; echo $?)
out=$(c --json verify); ok "verify json" $([ "$(json_num checked <<<"$out")" = 3 ]; echo $?)

# ---- export / import ---------------------------------------------------------
c export "${k2:0:10}" -o "$dir/k2.snap" >/dev/null; ok "export" $?
c evict "$k2" >/dev/null
c import "$dir/k2.snap" >/dev/null; ok "import" $?
c export "${k2:0:10}" -o "$dir/k2b.snap" >/dev/null
blob_bytes=$(c --json inspect "$k2" | json_num bytes)
cmp <(tail -c "$blob_bytes" "$dir/k2.snap") <(tail -c "$blob_bytes" "$dir/k2b.snap")
ok "export/import round trip is byte-identical" $?
# -o - is stdout: the snapshot alone on stdout, no file named "-"
mkdir "$dir/cwd"
(cd "$dir/cwd" && c export "${k2:0:10}" -o - > "$dir/stdout.snap" 2> "$dir/stdout.err"); rc=$?
ok "export -o - exits 0 (rc $rc)" $([ $rc = 0 ]; echo $?)
ok "export -o - creates no file named -" $([ ! -e "$dir/cwd/-" ] && [ -z "$(ls -A "$dir/cwd")" ]; echo $?)
cmp -s "$dir/stdout.snap" "$dir/k2b.snap"; ok "export -o - writes the same snapshot to stdout" $?
ok "export -o - reports on stderr" $(grep -q "exported ${k2:0:16}" "$dir/stdout.err"; echo $?)
(cd "$dir/cwd" && c --json export "${k2:0:10}" -o - > "$dir/stdout2.snap" 2>/dev/null)
cmp -s "$dir/stdout2.snap" "$dir/k2b.snap"; ok "--json export -o - keeps stdout for the snapshot" $?
# over an existing file: a new file renamed into place, never written in place
mkdir "$dir/exp"
printf 'old contents\n' > "$dir/old"
cp "$dir/old" "$dir/exp/k2.snap"
ln "$dir/exp/k2.snap" "$dir/exp-link"
c export "${k2:0:10}" -o "$dir/exp/k2.snap" >/dev/null; ok "export over an existing file" $?
cmp -s "$dir/exp/k2.snap" "$dir/k2b.snap"; ok "the target holds the new snapshot" $?
ok "the old file was replaced, not rewritten (a hard link to it keeps the old contents)" \
  $(cmp -s "$dir/exp-link" "$dir/old"; echo $?)
ok "no temporary file is left" $([ "$(ls -A "$dir/exp")" = k2.snap ]; echo $?)
# a write that fails half way (file size limit) leaves the old target whole
# and no temporary file
cp "$dir/old" "$dir/exp/k2.snap"
out=$( (trap '' XFSZ; ulimit -f 64; c export "${k2:0:10}" -o "$dir/exp/k2.snap") 2>&1 ); rc=$?
ok "export that cannot write exits 1, says the target was not changed (rc $rc: $out)" $([ $rc = 1 ] && grep -q "k2.snap was not changed" <<<"$out"; echo $?)
ok "and leaves the old target as it was" $(cmp -s "$dir/exp/k2.snap" "$dir/old"; echo $?)
ok "and no temporary file ($(ls -A "$dir/exp" | tr '\n' ' '))" $([ "$(ls -A "$dir/exp")" = k2.snap ]; echo $?)
mkdir "$dir/exp/adir"; touch "$dir/exp/adir/x"
c export "${k2:0:10}" -o "$dir/exp/adir" >/dev/null 2>&1; rc=$?
ok "export onto a directory exits 1, leaves no temporary file (rc $rc)" $([ $rc = 1 ] && [ "$(ls -A "$dir/exp" | tr '\n' ' ')" = "adir k2.snap " ]; echo $?)
c export "${k2:0:10}" -o "$dir/nonexistent/k2.snap" >/dev/null 2>&1; ok "export into a missing directory exits 1" $([ $? = 1 ]; echo $?)
before=$(c --json stat | json_num entries)
head -c 200000 "$dir/k2.snap" > "$dir/trunc.snap"
out=$(c import "$dir/trunc.snap" 2>&1); rc=$?
ok "import of a truncated file: exit 1, says truncated" $([ $rc = 1 ] && grep -q 'truncated' <<<"$out"; echo $?)
cp "$dir/k2.snap" "$dir/flip.snap"
printf '\x13' | dd of="$dir/flip.snap" bs=1 seek=300000 conv=notrunc 2>/dev/null
out=$(c import "$dir/flip.snap" 2>&1); rc=$?
ok "import of a flipped byte: exit 1, checksum" $([ $rc = 1 ] && grep -q 'checksum mismatch' <<<"$out"; echo $?)
# a file for another model: the twin's blobs under the tiny model's spec
python_free_swap() {
  local src=$1 dst=$2
  local hlen_hex
  hlen_hex=$(od -An -tu4 -j8 -N4 "$src" | tr -d ' ')
  local header
  header=$(dd if="$src" bs=1 skip=12 count="$hlen_hex" 2>/dev/null)
  local tinyspec
  tinyspec=$(tr -d '\n ' < "$tiny")
  local newhdr
  newhdr=$(sed -E "s/\"model\":\{[^}]*\[[^]]*\]\}/\"model\":$(sed 's/[&/\]/\\&/g' <<<"$tinyspec")/; s/\"fingerprint\":\"[0-9a-f]*\"/\"fingerprint\":\"c67bf269b47a8bcd6adc637780f384ef63a302e0d9d6541c5bc7886a5f84f2e6\"/" <<<"$header")
  { printf 'K3SNAP1\n'; printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $((${#newhdr} & 255)) $(((${#newhdr} >> 8) & 255)) $(((${#newhdr} >> 16) & 255)) 0)"; printf '%s' "$newhdr"; tail -c +$((13 + hlen_hex)) "$src"; } > "$dst"
}
python_free_swap "$dir/k2.snap" "$dir/other.snap"
out=$(c import "$dir/other.snap" 2>&1); rc=$?
ok "import of a file for another model: exit 1, says why ($out)" $([ $rc = 1 ] && grep -q 'nothing was stored' <<<"$out"; echo $?)
after=$(c --json stat | json_num entries)
ok "rejected imports stored nothing" $([ "$before" = "$after" ]; echo $?)
# progress (issue 16 item 6): on a terminal, export and import show bytes
# done, percent and rate on stderr; never piped, never with --json
err=$(c export "${k2:0:10}" -o "$dir/p.snap" 2>&1 >/dev/null)
ok "export piped: nothing on stderr ($err)" $([ -z "$err" ]; echo $?)
err=$(c import "$dir/k2.snap" 2>&1 >/dev/null)
ok "import piped: nothing on stderr ($err)" $([ -z "$err" ]; echo $?)
if script -qec true /dev/null >/dev/null 2>&1; then
  out=$(script -qec "'$ctl' --socket '$sock' export ${k2:0:10} -o '$dir/p.snap'" /dev/null 2>&1)
  ok "export on a terminal: reading and writing progress, then the report" $(grep -q "export ${k2:0:16}: reading .* of .* (100%)" <<<"$out" && grep -q "export ${k2:0:16}: writing .* (100%)" <<<"$out" && grep -q "exported ${k2:0:16}" <<<"$out"; echo $?)
  cmp -s "$dir/p.snap" "$dir/k2b.snap"; ok "and the same file" $?
  c evict "${k2:0:12}" >/dev/null  # so that the import sends it
  out=$(script -qec "'$ctl' --socket '$sock' import '$dir/k2.snap'" /dev/null 2>&1)
  ok "import on a terminal: checking and sending progress, then the report" $(grep -q 'import k2.snap: checking .* (100%)' <<<"$out" && grep -q 'import k2.snap: sending .* of .* (100%)' <<<"$out" && grep -q "imported ${k2:0:16} .*: stored" <<<"$out"; echo $?)
  out=$(script -qec "'$ctl' --socket '$sock' --json export ${k2:0:10} -o '$dir/p.snap'" /dev/null 2>&1)
  ok "--json export on a terminal: no progress" $(! grep -q '(100%)' <<<"$out" && grep -q '"bytes"' <<<"$out"; echo $?)
  out=$(script -qec "'$ctl' --socket '$sock' --db '$dir/db' export ${k2:0:10} -o '$dir/p.snap'" /dev/null 2>&1)
  ok "--db export on a terminal: progress too" $(grep -q "export ${k2:0:16}: reading .* (100%)" <<<"$out"; echo $?)
  out=$(script -qec "'$ctl' --socket '$sock' verify" /dev/null 2>&1)
  ok "verify on a terminal: says what it does, then the report" $(grep -q 'verify: checking every entry' <<<"$out" && grep -q 'verified [0-9]* entr' <<<"$out"; echo $?)
  out=$(script -qec "'$ctl' --db '$dir/db' verify" /dev/null 2>&1)
  ok "--db verify on a terminal: bytes checked, then the report" $(grep -q 'verify .* of .* (100%)' <<<"$out" && grep -q 'verified [0-9]* entr' <<<"$out"; echo $?)
  out=$(script -qec "'$ctl' --db '$dir/db' --json verify" /dev/null 2>&1)
  ok "--db --json verify on a terminal: no progress" $(! grep -q '(100%)' <<<"$out" && grep -q '"checked"' <<<"$out"; echo $?)
else
  echo "SKIP: no script(1): progress on a terminal is not tested"
fi

# ---- evict selectors ---------------------------------------------------------
out=$(c evict --model tiny-hybrid --dry-run)
ok "evict --model --dry-run lists" $(grep -q "^would evict ${k1:0:16}" <<<"$out" && grep -q 'would evict 1 entry' <<<"$out"; echo $?)
ok "dry run changed nothing" $([ "$(c --json stat | json_num entries)" = 3 ]; echo $?)
out=$(c --json evict --to-size 1K --dry-run)
ok "evict --to-size --dry-run json" $(grep -q "\"dry_run\": true" <<<"$out" && [ "$(json_num entries <<<"$out")" -ge 2 ]; echo $?)
out=$(c evict --idle 1h); ok "evict --idle 1h evicts nothing fresh" $(grep -q 'evicted 0 entries' <<<"$out"; echo $?)
out=$(c evict --model tiny-hybrid); ok "evict --model" $(grep -q 'evicted 1 entry, 576 B freed' <<<"$out"; echo $?)
out=$(c evict "${k3:0:12}"); ok "evict KEY" $(grep -q 'evicted 1 entry' <<<"$out"; echo $?)
c evict "${k3:0:12}" >/dev/null 2>&1; ok "evict of a missing key exits 4" $([ $? = 4 ]; echo $?)
c evict --all --idle 1h >/dev/null 2>&1; ok "two selectors: usage error" $([ $? = 2 ]; echo $?)
"$pub" "$sock" "$tiny" 9,9,9 >/dev/null
out=$(c evict --to-size 1K); ok "evict --to-size keeps the small one" $(grep -q "evicted ${k2:0:16}" <<<"$out" && [ "$(c --json stat | json_num entries)" = 1 ]; echo $?)
out=$(c evict --all </dev/null 2>&1); rc=$?
ok "evict --all without a terminal and --yes: exit 2, says add --yes (rc $rc: $out)" $([ $rc = 2 ] && grep -q -- 'add --yes' <<<"$out"; echo $?)
ok "and evicted nothing" $([ "$(c --json stat | json_num entries)" = 1 ]; echo $?)
echo yes | c evict --all >/dev/null 2>&1; rc=$?
ok "a piped 'yes' is no confirmation (rc $rc)" $([ $rc = 2 ] && [ "$(c --json stat | json_num entries)" = 1 ]; echo $?)
out=$(c evict --all --dry-run </dev/null); ok "evict --all --dry-run needs no --yes" $(grep -q 'would evict 1 entry' <<<"$out"; echo $?)
# on a terminal it asks (script(1) gives it one)
if script -qec true /dev/null >/dev/null 2>&1; then
  out=$(printf 'no\n' | script -qec "'$ctl' --socket '$sock' evict --all" /dev/null 2>&1)
  ok "evict --all on a terminal asks, and 'no' evicts nothing ($out)" $(grep -q "Type 'yes'" <<<"$out" && grep -q 'nothing evicted' <<<"$out" && [ "$(c --json stat | json_num entries)" = 1 ]; echo $?)
  for answer in yesterday 'yes, wait' yess; do
    out=$(printf '%s\n' "$answer" | script -qec "'$ctl' --socket '$sock' evict --all" /dev/null 2>&1)
    ok "evict --all on a terminal: '$answer' is not yes ($out)" $(grep -q 'nothing evicted' <<<"$out" && [ "$(c --json stat | json_num entries)" = 1 ]; echo $?)
  done
  out=$(printf 'yes\n' | script -qec "'$ctl' --socket '$sock' evict --all" /dev/null 2>&1)
  ok "evict --all on a terminal, answered yes, evicts" $(grep -q 'evicted 1 entry' <<<"$out" && [ "$(c --json stat | json_num entries)" = 0 ]; echo $?)
  "$pub" "$sock" "$tiny" 9,9,9 >/dev/null
else
  echo "SKIP: no script(1): the terminal prompt is not tested"
fi
out=$(c evict --all --yes </dev/null); ok "evict --all --yes (no terminal)" $(grep -q 'evicted 1 entry' <<<"$out"; echo $?)
# a dry run says what the evict frees, shared MLA blocks included: with the
# tiny model, k3pub's N:100, N:600 and N:1100 hold the same rows (their
# prefixes share blocks). N:1100, least recently used, frees its own chunks
# and the 8 blocks only it uses (20 KiB): enough for a target 10000 bytes
# under the total, which its own chunks alone are not
for n in 1100 600 100; do "$pub" "$sock" "$tiny" N:$n >/dev/null; done
total=$(c --json stat | json_num bytes)
asreal() { sed 's/^would evict/evicted/; s/ (dry run: nothing changed)$/ freed/'; }
dry=$(c evict --to-size $((total - 10000)) --dry-run)
drydb=$("$ctl" --db "$dir/db" evict --to-size $((total - 10000)) --dry-run)
real=$(c evict --to-size $((total - 10000)))
ok "evict --to-size frees the blocks of the one entry it needs ($real)" $(grep -q '^evicted 1 entry' <<<"$real"; echo $?)
ok "its dry run said the same entries and bytes ($dry)" $([ "$(asreal <<<"$dry")" = "$real" ]; echo $?)
ok "and so did --db's ($drydb)" $([ "$(asreal <<<"$drydb")" = "$real" ]; echo $?)
dry=$(c evict --all --dry-run); real=$(c evict --all --yes </dev/null)
ok "evict --all --dry-run said what --all freed ($dry)" $([ "$(asreal <<<"$dry")" = "$real" ] && grep -q '^evicted 2 entries' <<<"$real"; echo $?)
ok "and nothing is left" $([ "$(c --json stat | json_num bytes)" = 0 ]; echo $?)

# ---- an ambiguous prefix -----------------------------------------------------
"$pub" "$sock" "$tiny" collide > "$dir/collide"
pre=$(head -c 8 "$dir/collide")
out=$(c inspect "$pre" 2>&1); rc=$?
ok "ambiguous prefix exits 1 and lists candidates" $([ $rc = 1 ] && grep -q 'ambiguous: 2 entries' <<<"$out"; echo $?)

# ---- --db on a store whose daemon was SIGKILLed ------------------------------
"$pub" "$sock" "$twin" N:33 >/dev/null
kill -9 "$pid"; wait "$pid" 2>/dev/null; pid=
out=$("$ctl" --db "$dir/db" ls); ok "--db ls after SIGKILL" $(grep -q '^3 entries' <<<"$out"; echo $?)
out=$("$ctl" --db "$dir/db" verify); ok "--db verify after SIGKILL" $(grep -q '0 damaged' <<<"$out"; echo $?)
out=$("$ctl" --db "$dir/db" --json stat); ok "--db stat" $([ "$(json_num entries <<<"$out")" = 3 ]; echo $?)
k4=$("$ctl" key --model "$twin" --tokens "$(seq -s, 1 33)")
out=$("$ctl" --db "$dir/db" inspect "${k4:0:8}"); ok "--db inspect verifies" $([ "$(grep -c ' yes$' <<<"$out")" = 8 ]; echo $?)
out=$("$ctl" --db "$dir/db" models); ok "--db models" $(grep -q '^2 models' <<<"$out"; echo $?)
"$ctl" --db "$dir/db" export "${k4:0:8}" -o "$dir/k4.snap" >/dev/null; ok "--db export" $?
"$ctl" --db "$dir/db" evict --all --yes >/dev/null 2>&1; ok "--db evict refuses (read-only)" $([ $? = 1 ]; echo $?)
"$ctl" --db "$dir/nonexistent" ls >/dev/null 2>&1; ok "--db of a missing store exits 1" $([ $? = 1 ]; echo $?)

# ---- unreachable daemon ------------------------------------------------------
c ping >/dev/null 2>&1; ok "unreachable daemon exits 3" $([ $? = 3 ]; echo $?)
out=$(c ls 2>&1); ok "unreachable message names the socket" $(grep -q "$sock" <<<"$out"; echo $?)
K3CACHE_SOCKET=$sock "$ctl" stat >/dev/null 2>&1; ok "K3CACHE_SOCKET is the default" $([ $? = 3 ]; echo $?)
"$ctl" nosuch >/dev/null 2>&1; ok "unknown command exits 2" $([ $? = 2 ]; echo $?)
for cmd in ls inspect evict stat verify models ping export import; do
  "$ctl" $cmd --help >/dev/null 2>&1; ok "$cmd --help" $?
done

echo "$pass passed, $fail failed"
[ $fail = 0 ]
