#!/usr/bin/env bash
# The man pages k3cached(8) and k3cachectl(1): groff renders them with no
# warning, and they cannot drift from the programs: every long flag in
# `k3cached --help` is one of k3cached(8)'s options, every command in
# `k3cachectl --help` one of k3cachectl(1)'s, and every flag of k3cachectl
# and of each command's --help is in the page. Skipped where groff is absent
# (Debian's groff-base; scripts/install-deps installs it).
# usage: test_man.sh MAN_DIR K3CACHED K3CACHECTL
set -u
man=$1 daemon=$2 ctl=$3
if ! command -v groff >/dev/null 2>&1; then
  echo "groff not present (Debian: groff-base): man pages not checked"
  exit 77
fi
pass=0 fail=0
ok() { if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }
# plain text, no fonts, lines as long as they come (no flag broken across a
# line), minus signs as ASCII
render() {
  groff -man -Tutf8 -rLL=2000n -P-cbou "$1" 2>/dev/null | sed 's/\xe2\x88\x92/-/g'
}
version=$("$daemon" --version | awk '{ print $NF }')
for page in "$man/k3cached.8" "$man/k3cachectl.1"; do
  name=${page##*/}
  warn=$(groff -man -Tutf8 -ww -z "$page" 2>&1); rc=$?
  [ $rc = 0 ] && [ -z "$warn" ]; ok "groff -man -ww renders $name without warnings: $warn" $?
  for s in NAME SYNOPSIS DESCRIPTION OPTIONS "EXIT STATUS" ENVIRONMENT FILES "SEE ALSO"; do
    render "$page" | grep -q "^$s\$"; ok "$name has a section $s" $?
  done
  grep -q "^\.TH [A-Z3]* [18] [^ ]* \"k3cache $version\"" "$page"
  ok "$name names k3cache $version (k3cached --version) in .TH" $?
done
d=$(render "$man/k3cached.8")
grep -q '^SIGNALS$' <<<"$d"; ok "k3cached.8 has a section SIGNALS" $?
for sig in SIGTERM SIGHUP; do
  grep -q "^ *$sig\b" <<<"$(sed -n '/^SIGNALS$/,/^[A-Z]/p' <<<"$d")"; ok "k3cached.8 SIGNALS has $sig" $?
done

# k3cached: every long flag of --help is an option's heading in OPTIONS
opts=$(sed -n '/^OPTIONS$/,/^EXIT STATUS$/p' <<<"$d")
flags=$("$daemon" --help | grep -o -- '--[a-z][a-z0-9-]*' | sort -u)
[ "$(wc -l <<<"$flags")" -ge 20 ]; ok "k3cached --help lists its flags ($(wc -l <<<"$flags"))" $?
for f in $flags; do
  grep -Eq -- "^ +(-h, )?$f( |$)" <<<"$opts"; ok "k3cached.8 OPTIONS has $f (k3cached --help)" $?
done
# and every flag the page gives a heading is one the daemon knows
for f in $(grep -Eo -- '^ +(-h, )?--[a-z][a-z0-9-]*' <<<"$opts" | grep -o -- '--.*'); do
  grep -qx -- "$f" <<<"$flags"; ok "k3cached.8's $f is in k3cached --help" $?
done

# k3cachectl: every command of --help is a heading in COMMANDS, and every
# flag of --help and of each command's --help is in the page
c=$(render "$man/k3cachectl.1")
cmds_section=$(sed -n '/^COMMANDS$/,/^EXIT STATUS$/p' <<<"$c")
help=$("$ctl" --help)
cmds=$(sed -n '/^Commands/,/^Global options/p' <<<"$help" | grep '^  [a-z-]' |
       sed -E 's/^  (--db DIR )?//' | awk '$1 == "model" { print $1 " " $2; next } { print $1 }')
[ "$(wc -l <<<"$cmds")" -ge 14 ]; ok "k3cachectl --help lists its commands ($(tr '\n' ' ' <<<"$cmds"))" $?
flags=$(grep -o -- '--[a-z][a-z0-9-]*' <<<"$help")
while read -r cmd; do
  grep -Eq -- "^ +(--db DIR )?$cmd( |$)" <<<"$cmds_section"; ok "k3cachectl.1 COMMANDS has $cmd" $?
  # "model add" is two words
  sub=$("$ctl" $cmd --help 2>/dev/null) || sub=$("$ctl" ${cmd%% *} --help 2>/dev/null)
  ok "k3cachectl $cmd --help" $?
  # the usage line's flags (the text after it may name another program's)
  flags+=$'\n'$(head -1 <<<"$sub" | grep -o -- '--[a-z][a-z0-9-]*')
done <<<"$cmds"
for f in $(sort -u <<<"$flags"); do
  grep -Eq -- "(^|[^a-z-])$f([^a-z-]|$)" <<<"$c"; ok "k3cachectl.1 has $f (k3cachectl --help)" $?
done
for e in K3CACHE_SOCKET K3CACHE_TOKEN; do
  grep -Eq "^ +$e$" <<<"$c"; ok "k3cachectl.1 ENVIRONMENT has $e" $?
done
grep -Eq '^ +K3CACHE_SOCKET$' <<<"$d"; ok "k3cached.8 ENVIRONMENT has K3CACHE_SOCKET" $?
echo "$pass passed, $fail failed"
[ $fail = 0 ]
