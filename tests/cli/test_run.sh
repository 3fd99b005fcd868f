#!/usr/bin/env bash
# make run (scripts/run): the commands it prints for another terminal work
# against the daemon it starts, with RUN_ARGS naming its own --socket and
# --db, given as "--socket PATH" or "--socket=PATH", and without.
# usage: test_run.sh BUILD_DIR SRC_DIR
set -u
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd)
dir=$(mktemp -d /tmp/k3-run-XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
pass=0 fail=0
ok() { if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }

# runs scripts/run with ARGS from SRC_DIR (as make does, with the build at
# build/: a link to BUILD_DIR in a copy of the paths it names), waits for
# SOCK, then runs the printed lines in one shell, from SRC_DIR, with no
# K3CACHE_SOCKET of its own: try NAME SOCK ARGS...
try() {
  local name=$1 sock=$2; shift 2
  mkdir -p "$dir/tree/tools"
  ln -sfn "$build" "$dir/tree/build"
  cp "$src/tools/demo-conversation.txt" "$dir/tree/tools/"
  # exec all the way down: $! is the daemon itself, which kill stops
  bash -c 'cd "$1" && shift && exec env -u K3CACHE_SOCKET bash "$@"' _ "$dir/tree" \
    "$src/scripts/run" build "$@" >"$dir/$name.out" 2>"$dir/$name.err" &
  pid=$!
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
  ok "$name: the daemon is up on $sock" $([ -S "$sock" ]; echo $?)
  # the printed commands: the indented lines after the first
  sed -n '2,$p' "$dir/$name.out" | grep '^  ' | sed 's/^  //' > "$dir/$name.cmds"
  ok "$name: prints commands ($(cat "$dir/$name.out"))" $([ "$(wc -l < "$dir/$name.cmds")" -ge 4 ]; echo $?)
  (cd "$dir/tree" && env -u K3CACHE_SOCKET bash -e "$dir/$name.cmds") >"$dir/$name.ran" 2>&1
  ok "$name: every printed command works ($(tail -5 "$dir/$name.ran"))" $?
  ok "$name: ping answered" $(grep -q 'pong\|ok' "$dir/$name.ran"; echo $?)
  ok "$name: turn 2 reuses turn 1 through that daemon" \
    $(grep '^\[PREFIX\]' "$dir/$name.ran" | sed -n 2p | grep -vq 'reusing 0 of'; echo $?)
  kill "$pid"; wait "$pid" 2>/dev/null; pid=
}
try spaced "$dir/a.sock" --socket "$dir/a.sock" --db "$dir/a-db"
ok "spaced: the socket is named in what it prints" $(grep -qF "K3CACHE_SOCKET=$dir/a.sock" "$dir/spaced.out"; echo $?)
try equals "$dir/b.sock" --db "$dir/b-db" --socket="$dir/b.sock" --max-bytes 64MiB
# a relative --socket: relative to where make runs (the project root)
mkdir -p "$dir/tree/rel"
try relative "$dir/tree/rel/c.sock" --socket rel/c.sock --db "$dir/c-db"
ok "relative: printed as an absolute path" $(grep -qF "K3CACHE_SOCKET=$dir/tree/rel/c.sock" "$dir/relative.out"; echo $?)

# a --socket of a name that looks like an address: k3cached takes it as a
# path, so the commands get that file's absolute path
try prefixed "$dir/tree/unix:d.sock" --socket unix:d.sock --db "$dir/d-db"
ok "prefixed: printed as the file's absolute path" $(grep -qF "K3CACHE_SOCKET=$dir/tree/unix\:d.sock" "$dir/prefixed.out" || grep -qF "K3CACHE_SOCKET=$dir/tree/unix:d.sock" "$dir/prefixed.out"; echo $?)

echo "$pass passed, $fail failed"
[ $fail = 0 ]
