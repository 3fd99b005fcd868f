#!/usr/bin/env bash
# A full disk: a publish the disk refuses is answered FULL, naming the disk
# and its free space, logged as a warning; nothing is stored of it, the
# daemon stays up and the entries stored before are served. The store lives
# on a 24 MiB tmpfs, so this needs root (mount); skipped (77) where mounting
# is not allowed.
# usage: test_disk_full.sh K3CACHED K3CACHECTL K3PUB
set -u
daemon=$1 ctl=$2 pub=$3
dir=$(mktemp -d /tmp/k3full-test-XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  [ -n "${KEEP:-}" ] || umount "$dir/disk" 2>/dev/null
  [ -n "${KEEP:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT
mkdir "$dir/disk"
if [ "$(id -u)" != 0 ] || ! mount -t tmpfs -o size=24m tmpfs "$dir/disk" 2>/dev/null; then
  echo "skipped: mounting a small tmpfs needs root and mount rights"
  exit 77
fi
pass=0 fail=0
ok() { if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }
sock=$dir/k3.sock
"$daemon" --db "$dir/disk/db" --socket "$sock" --max-bytes 1GiB --log-level info 2>>"$dir/log" &
pid=$!
for _ in $(seq 100); do "$ctl" --socket "$sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
# KDA layers of 1 MiB: an entry of ~8 MiB
spec=$dir/spec.json
{
  printf '{"name":"full-disk","revision":"1","state_layout":"test","layers":['
  for i in $(seq 8); do printf '{"mixer":"kda","conv_len":131072,"recurrent_len":131072},'; done
  printf '{"mixer":"mla","k_row":4,"v_row":4}]}'
} > "$spec"
first=$("$pub" "$sock" "$spec" N:32 first 1 2>&1 | tail -1)
ok "the first entry is stored" $([ ${#first} = 64 ]; echo $?)
out=
for i in 2 3 4 5 6; do
  out=$("$pub" "$sock" "$spec" N:32 "e$i" "$i" 2>&1) || break
done
ok "a publish fails once the disk is full" $(grep -q FULL <<<"$out"; echo $?)
ok "its message names the full disk and its free space ($out)" \
  $(grep -q "disk holding the store ($dir/disk/db) is full (.* bytes free)" <<<"$out"; echo $?)
ok "the daemon logs it as a warning" $(grep -q 'warn: .*FULL: publish: the disk holding the store' "$dir/log"; echo $?)
"$ctl" --socket "$sock" ping >/dev/null; ok "the daemon is up" $?
"$ctl" --socket "$sock" export "${first:0:16}" -o "$dir/first.k3snap" >/dev/null 2>&1
ok "the entry stored before is served" $?
ok "nothing of the failed publish is stored" \
  $([ "$("$ctl" --socket "$sock" --json stat | sed -n 's/.*"staging": *\([0-9]*\).*/\1/p')" = 0 ]; echo $?)
kill -TERM "$pid"; wait "$pid" 2>/dev/null; pid=
echo "$pass passed, $fail failed"
[ $fail = 0 ]
