#!/usr/bin/env bash
# k3worker's command line, no daemon needed: every numeric flag refuses what
# is not a whole decimal number in its range (exit 2, saying which flag and
# what it takes) instead of reading it as 0 or as its leading digits.
# usage: test_worker_flags.sh K3WORKER SRC_DIR
set -u
worker=$1 src=$2
conv=$src/tests/worker/conversation.txt
pass=0 fail=0
dir=$(mktemp -d /tmp/k3worker-flags-XXXXXX)
trap 'rm -rf "$dir"' EXIT
ok() { if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }

# refused: FLAG VALUE (the rest of the command line is valid)
refused() {
  local flag=$1 val=$2 err rc
  err=$("$worker" --no-cache --conversation "$conv" "$flag" "$val" 2>&1 >/dev/null); rc=$?
  ok "$flag '$val' exits 2 (rc $rc)" $([ $rc = 2 ]; echo $?)
  ok "$flag '$val' names the flag and the value ($err)" \
    $(grep -q -- "$flag" <<<"$err" && grep -qF -- "\"$val\"" <<<"$err"; echo $?)
}
for v in abc 3x "" " 3" 3.0 -1 +1 0x2 1e1 0 18446744073709551617 99999999999999999999999; do
  refused --turn "$v"
done
for v in banana "" 1x -1 " 1" 0x10 1e3 18446744073709551616; do
  refused --seed "$v"
done
for v in x "" 64k -1 " 5" 4294967296; do
  refused --chunk "$v"
done
for v in y "" 0 8.5 -8 4097 4294967296; do
  refused --max-new "$v"
done

# --model: a geometry by name; another is refused naming it and the choices,
# in one line, not the whole usage
for v in huge "" TINY tin; do
  refused --model "$v"
  err=$("$worker" --no-cache --conversation "$conv" --model "$v" 2>&1 >/dev/null)
  ok "--model '$v' names the choices in one line ($err)" \
    $([ "$err" = "k3worker: --model is tiny or twin, not \"$v\"" ]; echo $?)
done
# what else used to print the whole usage says what is wrong, in one line
err=$("$worker" --no-cache 2>&1 >/dev/null); rc=$?
ok "no prompt: exit 2, says to give one ($rc: $err)" \
  $([ $rc = 2 ] && [ "$err" = "k3worker: give --conversation FILE or --prompt TEXT (k3worker --help for the rest)" ]; echo $?)
err=$("$worker" --no-cache --prompt hi --conversation "$conv" 2>&1 >/dev/null); rc=$?
ok "both prompts: exit 2, says to give one ($rc: $err)" \
  $([ $rc = 2 ] && [ "$err" = "k3worker: --conversation and --prompt both give the prompt: give one" ]; echo $?)
err=$("$worker" --no-cache --prompt hi extra 2>&1 >/dev/null); rc=$?
ok "an operand: exit 2, names it ($rc: $err)" \
  $([ $rc = 2 ] && [ "$err" = "k3worker: unexpected argument \"extra\" (a prompt with spaces is one quoted --prompt)" ]; echo $?)

# --print-spec: the model spec an admin adds (k3cachectl model add FILE), as
# JSON on stdout; no daemon is asked, nothing else is run
for m in tiny twin; do
  out=$("$worker" --model "$m" --seed 7 --print-spec 2>"$dir/spec.err"); rc=$?
  ok "--model $m --print-spec exits 0 with nothing on stderr ($rc)" $([ $rc = 0 ] && [ ! -s "$dir/spec.err" ]; echo $?)
  ok "--model $m --print-spec: JSON naming k3worker-$m, revision seed-7, 8 layers ($out)" \
    $(python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); sys.exit(0 if d["name"]==sys.argv[1] and d["revision"]=="seed-7" and len(d["layers"])==8 else 1)' "k3worker-$m" <<<"$out"; echo $?)
done
a=$("$worker" --print-spec) b=$("$worker" --model tiny --seed 1 --print-spec)
ok "--print-spec's defaults are the worker's (tiny, seed 1)" $([ -n "$a" ] && [ "$a" = "$b" ]; echo $?)
err=$("$worker" --print-spec --prompt hi 2>&1 >/dev/null); rc=$?
ok "--print-spec with a prompt: exit 2, says it runs nothing ($rc: $err)" \
  $([ $rc = 2 ] && grep -q -- '--print-spec runs no prompt' <<<"$err"; echo $?)

# accepted: the edges of each range
out=$("$worker" --no-cache --prompt hi --seed 18446744073709551615 2>&1); rc=$?
ok "--seed 18446744073709551615 (u64 max) runs ($rc: $out)" $([ $rc = 0 ]; echo $?)
"$worker" --no-cache --prompt hi --seed 0 >/dev/null 2>&1; ok "--seed 0 runs" $?
a=$("$worker" --no-cache --prompt hi --seed 0 | grep '^logits')
b=$("$worker" --no-cache --prompt hi --seed 1 | grep '^logits')
ok "--seed 0 is not --seed 1" $([ -n "$a" ] && [ "$a" != "$b" ]; echo $?)
"$worker" --no-cache --prompt hi --max-new 4096 >/dev/null 2>&1; ok "--max-new 4096 runs" $?
out=$("$worker" --no-cache --prompt hi --chunk 1 --max-new 1 2>&1); rc=$?
ok "--chunk 1 --max-new 1 runs" $([ $rc = 0 ] && [ "$(grep -c '^reply ' <<<"$out")" = 1 ]; echo $?)
out=$("$worker" --no-cache --conversation "$conv" --turn 1 2>&1); rc=$?
ok "--turn 1 runs only turn 1" $([ $rc = 0 ] && [ "$(grep -c '^== turn' <<<"$out")" = 1 ]; echo $?)
"$worker" --no-cache --conversation "$conv" --turn 99 >/dev/null 2>&1; rc=$?
ok "--turn past the last turn exits 1 (rc $rc)" $([ $rc = 1 ]; echo $?)

# --replies FILE: each earlier turn's line is exactly --max-new token ids
for line in "1 2 x" "1 2" "1 2 3 4" "1  2 3" "1 -2 3" "1 2 3x" ""; do
  printf '%s\n' "$line" > "$dir/replies"
  err=$("$worker" --no-cache --conversation "$conv" --turn 2 --max-new 3 --replies "$dir/replies" 2>&1 >/dev/null); rc=$?
  ok "--replies line '$line' for --max-new 3 is refused (rc $rc: $err)" \
    $([ $rc = 1 ] && grep -q 'lacks the replies' <<<"$err"; echo $?)
done
printf '1 2 3\n' > "$dir/replies"
"$worker" --no-cache --conversation "$conv" --turn 2 --max-new 3 --replies "$dir/replies" >/dev/null 2>&1
ok "--replies with a good line runs" $?

echo "$pass passed, $fail failed"
[ $fail = 0 ]
