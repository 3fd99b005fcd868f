#!/usr/bin/env bash
# The offline k3cachectl commands, run as a user would, against shared/.
set -u
ctl=$1
shared=$2
fail=0
pass=0
check() { # name, condition result
  if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi
}

# structural vectors: exit code and the class word on stderr
while IFS=$'\037' read -r file expect _; do
  [ "$file" = file ] && continue
  err=$("$ctl" blob "$shared/vectors/$file" 2>&1 >/dev/null); rc=$?
  case $expect in
    ok:*) [ $rc = 0 ] && [ -z "$err" ]; check "blob $file ok" $? ;;
    error:*) cls=${expect#error:}
      [ $rc = 1 ] && [[ $err == "invalid ($cls): "* ]]; check "blob $file -> $cls (rc $rc, $err)" $? ;;
  esac
done < <(tr "\t" "\037" < "$shared/vectors/structural.tsv")

# semantic vectors, human and JSON
while IFS=$'\037' read -r file model layer plen expect _; do
  [ "$file" = file ] && continue
  out=$("$ctl" --json blob "$shared/vectors/$file" --model "$shared/$model" --layer "$layer" --prefix-len "$plen" 2>/dev/null); rc=$?
  case $expect in
    ok) [ $rc = 0 ] && grep -q '"valid": true' <<<"$out"; check "json blob $file ok" $? ;;
    error:*) cls=${expect#error:}
      [ $rc = 1 ] && grep -q "\"class\": \"$cls\"" <<<"$out" && grep -q '"valid": false' <<<"$out"
      check "json blob $file -> $cls" $? ;;
  esac
done < <(tr "\t" "\037" < "$shared/vectors/semantic.tsv")

# human output names the fields
out=$("$ctl" blob "$shared/vectors/blobs/ok_mla_3tok.bin")
grep -q '^tag  *MLA (2)' <<<"$out" && grep -q '^seq_len  *3' <<<"$out" && grep -q '^k  *18 floats' <<<"$out"
check "blob human fields" $?
# the checksum is seeded by --layer
a=$("$ctl" --json blob "$shared/vectors/blobs/sem_ok_kda_layer0.bin" | grep xxh3)
b=$("$ctl" --json blob "$shared/vectors/blobs/sem_ok_kda_layer0.bin" --model "$shared/models/tiny-hybrid.json" --layer 1 | grep xxh3)
[ -n "$a" ] && [ "$a" != "$b" ]; check "checksum seeded by layer" $?

# fingerprints and keys from the fixture
while IFS=$'\037' read -r kind model salt tokens sha; do
  [ "$kind" = kind ] && continue
  if [ "$kind" = fingerprint ]; then
    got=$("$ctl" model fingerprint "$shared/models/$model")
  else
    got=$("$ctl" key --model "$shared/models/$model" --salt "$salt" --tokens "$tokens")
  fi
  [ "$got" = "$sha" ]; check "$kind $model $salt $tokens" $?
done < <(tr "\t" "\037" < "$shared/models/FINGERPRINTS.tsv")

# usage errors exit 2, missing files exit 1
"$ctl" blob >/dev/null 2>&1; [ $? = 2 ]; check "blob without FILE is a usage error" $?
"$ctl" nosuch >/dev/null 2>&1; [ $? = 2 ]; check "unknown command is a usage error" $?
out=$("$ctl" stats 2>&1)
[ "$(wc -l <<<"$out")" = 1 ] && grep -q 'unknown command "stats" (did you mean "stat"?)' <<<"$out" && grep -q -- "--help" <<<"$out"
check "a mistyped command: one line, a guess and where the help is ($out)" $?
out=$("$ctl" --jsn ping 2>&1); rc=$?
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 2 ] && grep -q "k3cachectl --help" <<<"$out"
check "an unknown option: getopt's line and where the help is, not the whole help ($out)" $?
"$ctl" key --model "$shared/models/tiny-hybrid.json" --tokens 1,x >/dev/null 2>&1; [ $? = 2 ]; check "bad token list" $?
# a global option after the command: refused (exit 2, before any daemon is
# asked), saying that it goes before the command and how; every global option
# of --help (but --help, which any command takes), after every command
globals=$("$ctl" --help | sed -n '/^Global options/,/^[^ G]/p' | grep -oE '^  --[a-z-]+( [A-Z]+)?' | sed 's/^  //')
ok_globals=0
while read -r opt meta; do
  [ "$opt" = --help ] && continue
  ok_globals=$((ok_globals + 1))
  val=${meta:+/tmp/x}
  for cmd in ping stat ls "inspect|0123456789abcdef" "evict|--all" verify models \
    "export|0123456789abcdef -o -" "model add|m.json" "import|f.k3snap" "blob|f.bin" \
    "model fingerprint|m.json" "key|--tokens 1" "salvage|--to d"; do
    name=${cmd%%|*} args=; [ "$name" != "$cmd" ] && args=${cmd#*|}
    # shellcheck disable=SC2086
    err=$("$ctl" $name $args $opt $val 2>&1 >/dev/null); rc=$?
    # --json is an option of most commands too: the ones without it refuse it
    case "$opt:$name" in
      --json:export|"--json:model add"|--json:import|"--json:model fingerprint") ;;
      --json:*) ! head -1 <<<"$err" | grep -q -- --json
        check "$name takes --json after it ($err)" $?
        continue ;;
    esac
    if [ "$opt" = --version ]; then
      want="k3cachectl $name: --version is a global option: k3cachectl --version"
    else
      want="k3cachectl $name: $opt is a global option: it goes before the command: k3cachectl $opt${val:+ $val} $name"
    fi
    [ $rc = 2 ] && [ "$(head -1 <<<"$err")" = "$want" ]
    check "$name $args $opt${val:+ $val}: a global option, before the command (rc $rc: $err)" $?
  done
done <<<"$globals"
[ "$ok_globals" -ge 4 ]; check "--help lists the global options (--socket --db --json --version): $ok_globals" $?
# a command's own option misused: which one and why, in k3cachectl's words
# (not getopt's "evict: option '--idle' requires an argument")
err=$("$ctl" --socket /nonexistent/k3.sock evict --idle 2>&1 >/dev/null); rc=$?
[ $rc = 2 ] && [ "$(head -1 <<<"$err")" = "k3cachectl evict: --idle needs a value" ]; check "evict --idle without a value (rc $rc: $err)" $?
err=$("$ctl" --socket /nonexistent/k3.sock stat --bogus 2>&1 >/dev/null); rc=$?
[ $rc = 2 ] && [ "$(head -1 <<<"$err")" = "k3cachectl stat: unknown option --bogus" ]; check "stat --bogus names it (rc $rc: $err)" $?
err=$("$ctl" --socket /nonexistent/k3.sock ping --json=1 2>&1 >/dev/null); rc=$?
[ $rc = 2 ] && [ "$(head -1 <<<"$err")" = "k3cachectl ping: --json takes no value" ]; check "ping --json=1 (rc $rc: $err)" $?
err=$("$ctl" export 0123456789abcdef -x 2>&1 >/dev/null); rc=$?
[ $rc = 2 ] && [ "$(head -1 <<<"$err")" = "k3cachectl export: unknown option -x" ]; check "export -x (rc $rc: $err)" $?
# a short option refused inside a bundle after a long one: the bundle's, not
# the long one's (it said "unknown option --dry-run")
err=$("$ctl" --socket /nonexistent/k3.sock evict --dry-run -xy 2>&1 >/dev/null); rc=$?
[ $rc = 2 ] && [ "$(head -1 <<<"$err")" = "k3cachectl evict: unknown option -x" ]; check "evict --dry-run -xy names -x (rc $rc: $err)" $?
err=$("$ctl" export 0123456789abcdef -o 2>&1 >/dev/null); rc=$?
[ $rc = 2 ] && [ "$(head -1 <<<"$err")" = "k3cachectl export: -o needs a value" ]; check "export -o without a value (rc $rc: $err)" $?

# sizes and durations: decimal with an optional fraction and unit, nothing
# else (refused before any daemon is asked, so these need none)
for s in 0x10KiB 1e3 inf nan " 1K" -1K +1K 1.5.5G "1 K"; do
  err=$("$ctl" --socket /nonexistent/k3.sock evict --to-size "$s" 2>&1 >/dev/null); rc=$?
  [ $rc = 2 ] && grep -q -- '--to-size takes a size' <<<"$err"; check "evict --to-size '$s' is a usage error (rc $rc)" $?
done
for s in 1e3 0x10 inf " 1h" 1.h; do
  "$ctl" --socket /nonexistent/k3.sock evict --idle "$s" >/dev/null 2>&1; rc=$?
  [ $rc = 2 ]; check "evict --idle '$s' is a usage error (rc $rc)" $?
done
for s in 0 0s 0.0m; do
  err=$("$ctl" --socket /nonexistent/k3.sock evict --idle "$s" --dry-run 2>&1 >/dev/null); rc=$?
  [ $rc = 2 ] && grep -qF -- "--idle $s: must be more than 0; --idle takes a duration such as 30m or 2d" <<<"$err"
  check "evict --idle '$s' says it must be more than 0 (rc $rc: $err)" $?
done
err=$("$ctl" --socket /nonexistent/k3.sock evict --idle 0.5s --dry-run 2>&1 >/dev/null)
grep -qF '0.5s counts as 0 whole seconds' <<<"$err"; check "evict --idle 0.5s: rounded down to 0 ($err)" $?
err=$("$ctl" --socket /nonexistent/k3.sock evict --idle soon --dry-run 2>&1 >/dev/null)
! grep -q 'more than 0' <<<"$err" && grep -q -- '--idle takes a duration' <<<"$err"
check "evict --idle soon: not a duration, no word of 0 ($err)" $?
"$ctl" --socket /nonexistent/k3.sock evict --to-size 1.5GiB >/dev/null 2>&1
[ $? = 3 ]; check "evict --to-size 1.5GiB is a size (then: no daemon)" $?
# whole-number flags: digits only (no space, sign, fraction or hex)
blob=$shared/vectors/blobs/sem_ok_kda_layer0.bin
for v in " 1" "1 " +1 -1 1.0 0x1 1e0 x ""; do
  err=$("$ctl" blob "$blob" --layer "$v" 2>&1 >/dev/null); rc=$?
  [ $rc = 2 ] && grep -q -- '--layer takes a whole number' <<<"$err"; check "blob --layer '$v' is a usage error (rc $rc)" $?
  "$ctl" --socket /nonexistent/k3.sock ls --limit "$v" >/dev/null 2>&1; rc=$?
  [ $rc = 2 ]; check "ls --limit '$v' is a usage error (rc $rc)" $?
  "$ctl" --socket /nonexistent/k3.sock inspect 0123456789abcdef --layer "$v" >/dev/null 2>&1; rc=$?
  [ $rc = 2 ]; check "inspect --layer '$v' is a usage error (rc $rc)" $?
done
# stat --interval is a duration like the others (a bare number is seconds,
# a fraction allowed): no sign, space, exponent or hex; --count is digits
for v in " 1" "1 " +1 -1 0x1 1e0 x "" inf nan 0.05 86401 1h1; do
  "$ctl" --socket /nonexistent/k3.sock stat --interval "$v" --count 1 >/dev/null 2>&1; rc=$?
  [ $rc = 2 ]; check "stat --interval '$v' is a usage error (rc $rc)" $?
done
for v in 0.2 1 1s 500ms 1.5m; do
  "$ctl" --socket /nonexistent/k3.sock stat --interval "$v" --count 1 >/dev/null 2>&1; rc=$?
  [ $rc = 3 ]; check "stat --interval '$v' is an interval (then: no daemon, rc $rc)" $?
done
for v in " 1" "1 " +1 -1 1.0 0x1 1e0 x "" 0 99999999999999999999; do
  "$ctl" --socket /nonexistent/k3.sock stat --interval 1 --count "$v" >/dev/null 2>&1; rc=$?
  [ $rc = 2 ]; check "stat --count '$v' is a usage error (rc $rc)" $?
done
"$ctl" blob "$blob" --prefix-len 4294967296 >/dev/null 2>&1; [ $? = 2 ]; check "blob --prefix-len past u32 is a usage error" $?
# token lists: an empty item (doubled, leading or trailing comma) is refused,
# not skipped (1,,3 used to give the key of 1,3)
out=$("$ctl" key --model "$shared/models/tiny-hybrid.json" --tokens 1,,3 2>&1)
grep -q 'item 2 of the list is empty' <<<"$out"
check "key --tokens 1,,3 names item 2, counting from 1 ($out)" $?
for t in 1,,3 ,1,2 1,2, , ,, 1,2,,; do
  out=$("$ctl" key --model "$shared/models/tiny-hybrid.json" --tokens "$t" 2>&1); rc=$?
  [ $rc = 2 ] && grep -q 'empty' <<<"$out" && ! grep -q '^[0-9a-f]\{64\}$' <<<"$out"
  check "key --tokens '$t' is a usage error naming the empty item (rc $rc: $out)" $?
done
"$ctl" key --model "$shared/models/tiny-hybrid.json" --tokens "" >/dev/null 2>&1; [ $? = 2 ]; check "key --tokens '' is a usage error" $?
"$ctl" key --model "$shared/models/tiny-hybrid.json" --tokens "1, 2" >/dev/null 2>&1; [ $? = 2 ]; check "key --tokens '1, 2' is a usage error" $?
"$ctl" blob /nonexistent >/dev/null 2>&1; [ $? = 1 ]; check "missing blob file" $?
"$ctl" model fingerprint /nonexistent >/dev/null 2>&1; [ $? = 1 ]; check "missing spec" $?
"$ctl" --help | grep -q 'usage: k3cachectl'; check "--help" $?

echo "$pass passed, $fail failed"
[ $fail = 0 ]
