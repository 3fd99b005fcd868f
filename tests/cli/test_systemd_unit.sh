#!/usr/bin/env bash
# The systemd unit that make install writes (from etc/k3cached.service.in,
# with the install prefix's paths) passes systemd-analyze verify, keeps the
# sandboxing it promises, and runs as the user and group that the installed
# sysusers.d file creates. Skipped where systemd-analyze is absent.
# usage: test_systemd_unit.sh BUILD_DIR
set -u
build=$1
tmp=$(mktemp -d /tmp/k3unit-test-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
pass=0 fail=0
ok() { if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }
cmake --install "$build" --prefix "$prefix" >/dev/null; ok "cmake --install --prefix $prefix" $?
unit=$prefix/lib/systemd/system/k3cached.service
sysusers=$prefix/lib/sysusers.d/k3cache.conf
for opt in RuntimeDirectory=k3cache StateDirectory=k3cache User=k3cache Group=k3cache \
           Type=notify NoNewPrivileges=yes ProtectSystem=strict PrivateTmp=yes ProtectHome=yes \
           KillSignal=SIGTERM RuntimeDirectoryMode=0750 UMask=0007 \
           EnvironmentFile=-/etc/default/k3cached; do
  grep -qx -- "$opt" "$unit"; ok "the unit has $opt" $?
done
! grep -En '@[A-Z_]+@' "$unit"; ok "no @VARIABLE@ left in the unit" $?
# the paths are the install prefix's
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
[ "$exec_start" = "$prefix/sbin/k3cached --db /var/lib/k3cache --socket /run/k3cache/k3cached.sock --max-bytes 64GiB --durability safe \$K3CACHED_OPTS" ]
ok "ExecStart runs $prefix/sbin/k3cached, the site's \$K3CACHED_OPTS last ($exec_start)" $?
[ -x "$prefix/sbin/k3cached" ]; ok "ExecStart's program is installed" $?
grep -qx "Documentation=man:k3cached(8) man:k3cachectl(1) file://$prefix/share/doc/k3cache/README.md" "$unit"
ok "Documentation names the man pages and $prefix's README" $?
[ -f "$prefix/share/doc/k3cache/README.md" ]; ok "the README it names is installed" $?
# the daemon takes the unit's flags (with --help last: parsed, not run)
read -ra argv <<<"${exec_start% \$K3CACHED_OPTS}"
"${argv[@]}" --help >/dev/null; ok "k3cached takes ExecStart's flags" $?

# the sysusers.d file creates the unit's user and group (in a root of its own)
if command -v systemd-sysusers >/dev/null 2>&1; then
  mkdir -p "$tmp/root/etc"
  out=$(systemd-sysusers --root="$tmp/root" - <"$sysusers" 2>&1); ok "systemd-sysusers takes k3cache.conf: $out" $?
  grep -Eq '^k3cache:x:[0-9]+:[0-9]+:k3cache daemon:/var/lib/k3cache:' "$tmp/root/etc/passwd"
  ok "it creates the user k3cache, home /var/lib/k3cache" $?
  gid=$(awk -F: '$1 == "k3cache" { print $4 }' "$tmp/root/etc/passwd")
  [ -n "$gid" ] && [ "$(awk -F: '$1 == "k3cache" { print $3 }' "$tmp/root/etc/group")" = "$gid" ]
  ok "and the group k3cache, the user's own" $?
else
  echo "systemd-sysusers not present: k3cache.conf not run"
fi

if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "systemd-analyze not present: verify skipped"
  [ $fail = 0 ] && exit 77
  exit 1
fi
# the installed unit as it is: ExecStart's program exists, and its
# Documentation's man pages are found under the prefix (verify runs man)
out=$(MANPATH=$prefix/share/man systemd-analyze verify "$unit" 2>&1)
rc=$?
[ $rc = 0 ] && [ -z "$out" ]; ok "systemd-analyze verify $unit: $out" $?
# the sandbox's exposure, as systemd scores it (0 best, 10 worst): 1.8 when
# this was written; a change that weakens it past 3 fails here (the
# threshold counts tenths)
out=$(systemd-analyze security --offline=true --threshold=30 "$unit" 2>&1)
rc=$?
exposure=$(grep -o 'Overall exposure level for k3cached.service: [0-9.]*' <<<"$out" | awk '{ print $NF }')
echo "systemd-analyze security: exposure ${exposure:-?}"
[ $rc = 0 ] && [ -n "$exposure" ]; ok "systemd-analyze security: exposure ${exposure:-?} at most 3: $(tail -1 <<<"$out")" $?
echo "$pass passed, $fail failed"
[ $fail = 0 ]
