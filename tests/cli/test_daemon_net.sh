#!/usr/bin/env bash
# k3cached's flags and surfaces: TCP listening, Prometheus /metrics, --help,
# a live socket refused, a stale socket replaced, bad flags and addresses, the
# bound addresses logged, SIGHUP, the directories created, a store over
# --max-bytes at start-up.
# usage: test_daemon_net.sh K3CACHED K3CACHECTL K3PUB SHARED
set -u
daemon=$1 ctl=$2 pub=$3 shared=$4
dir=$(mktemp -d /tmp/k3net-test-XXXXXX)
sock=$dir/k3cached.sock
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"; [ -n "${rundir_made:-}" ] && rm -rf /run/k3cache; }
trap cleanup EXIT
pass=0 fail=0
ok() { if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }
json_num() { grep -o "\"$1\": [0-9]*" | head -1 | grep -o '[0-9]*$'; }
up() { for _ in $(seq 100); do "$ctl" --socket "$1" ping >/dev/null 2>&1 && return 0; sleep 0.05; done; return 1; }
http_get() { # host port path
  exec 9<>"/dev/tcp/$1/$2" || return 1
  printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$3" "$1" >&9
  cat <&9
  exec 9>&-
}

out=$("$daemon" --help); ok "--help lists the flags" $(for f in --db --socket --listen --max-bytes --durability --metrics --max-payload --max-inflight --stage-size --yield-rate --min-upload-rate --min-download-rate --log-level; do grep -q -- "$f" <<<"$out" || exit 1; done; echo 0)
"$daemon" --durability bogus >/dev/null 2>&1; ok "a bad --durability is a usage error" $([ $? = 2 ]; echo $?)
out=$("$daemon" --bogus 2>&1); rc=$?
ok "an unknown flag: exit 2, getopt's line and where the help is, not the whole help ($out)" $([ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 2 ] && grep -q "k3cached --help" <<<"$out"; echo $?)
"$daemon" --max-bytes lots >/dev/null 2>&1; ok "a bad size is a usage error" $([ $? = 2 ]; echo $?)
"$daemon" --stage-size 0 >/dev/null 2>&1; ok "a zero --stage-size is a usage error" $([ $? = 2 ]; echo $?)
"$daemon" --yield-rate fast >/dev/null 2>&1; ok "a --yield-rate that is not a size is a usage error" $([ $? = 2 ]; echo $?)

for try in 1 2 3 4 5; do
  p1=$((20000 + RANDOM % 20000)); p2=$((p1 + 1))
  "$daemon" --db "$dir/db" --socket "$sock" --insecure-tcp --listen "127.0.0.1:$p1" --metrics "127.0.0.1:$p2" \
    --log-level warn 2>>"$dir/log" &
  pid=$!
  up "$sock" && break
  kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=
done
ok "daemon up with --listen and --metrics" $([ -n "$pid" ]; echo $?)
ok "socket mode 0660" $([ "$(stat -c %a "$sock")" = 660 ]; echo $?)
out=$("$ctl" --socket "tcp:127.0.0.1:$p1" ping); ok "ping over TCP" $(grep -q '^PONG' <<<"$out"; echo $?)
# the client refuses a port that does not exist rather than dial another
for bad in 99999 0 7x 65536; do
  out=$("$ctl" --socket "tcp:127.0.0.1:$bad" ping 2>&1); rc=$?
  ok "client: tcp:127.0.0.1:$bad is refused as a bad port, a usage error (rc $rc)" $([ $rc = 2 ] && grep -q '1 to 65535' <<<"$out"; echo $?)
done
"$pub" "tcp:127.0.0.1:$p1" "$shared/models/tiny-hybrid.json" 1,2,3,4 >/dev/null; ok "publish over TCP" $?
out=$("$ctl" --socket "unix:$sock" ls); ok "and it is there over the Unix socket" $(grep -q '^1 entry' <<<"$out"; echo $?)
"$ctl" --socket "$sock" inspect 00000000 >/dev/null 2>&1
m=$(http_get 127.0.0.1 "$p2" /metrics)
ok "metrics: HTTP 200" $(grep -q '^HTTP/1.[01] 200' <<<"$m"; echo $?)
ok "metrics: entries gauge" $(grep -q '^k3cache_entries 1$' <<<"$m"; echo $?)
ok "metrics: publishes counter" $(grep -q '^k3cache_publishes_total 1$' <<<"$m"; echo $?)
ok "metrics: errors by code, one family" $(grep -q '^k3cache_errors_total{code="not_found"} 1$' <<<"$m"; echo $?)
ok "metrics: requests by op, one family" $(grep -q '^k3cache_requests_total{op="publish"} 1$' <<<"$m"; echo $?)
ok "metrics: build_info and process_start_time_seconds" $(grep -q '^k3cache_build_info{version="[0-9.]*"} 1$' <<<"$m" && grep -q '^process_start_time_seconds [0-9]' <<<"$m"; echo $?)
ok "metrics: byte gauges end in _bytes" $(grep -q '^k3cache_stored_bytes [0-9]' <<<"$m" && grep -q '^k3cache_received_bytes_total [0-9]' <<<"$m"; echo $?)
ok "metrics: a HELP on every family, none undocumented" $([ "$(grep -c '^# HELP' <<<"$m")" = "$(grep -c '^# TYPE' <<<"$m")" ] && ! grep -q 'undocumented' <<<"$m"; echo $?)
ok "metrics: an op not asked yet has its series" $(grep -q '^k3cache_request_seconds_count{op="verify"} 0' <<<"$m"; echo $?)
if command -v promtool >/dev/null; then
  body=$(sed '1,/^\r*$/d' <<<"$m")
  out=$(promtool check metrics <<<"$body" 2>&1); ok "metrics: promtool check metrics passes ($out)" $([ $? = 0 ] && [ -z "$out" ]; echo $?)
else
  echo "SKIP: promtool check metrics (promtool missing: Debian's prometheus package)"
fi
ok "metrics: connections" $(grep -q '^k3cache_connections_accepted_total [0-9]' <<<"$m" && grep -q '^k3cache_connections_open [0-9]' <<<"$m"; echo $?)
ok "metrics: latency histogram" $(grep -q '^k3cache_request_seconds_bucket{op="publish",le="+Inf"} 1$' <<<"$m"; echo $?)

"$daemon" --db "$dir/db2" --socket "$sock" 2>"$dir/second.err"; rc=$?
ok "a second daemon on a live socket is refused" $([ $rc != 0 ] && grep -q 'another daemon is listening' "$dir/second.err"; echo $?)
kill -9 "$pid"; wait "$pid" 2>/dev/null; pid=
ok "a SIGKILLed daemon leaves its socket file" $([ -S "$sock" ]; echo $?)
"$daemon" --db "$dir/db" --socket "$sock" --log-level warn 2>>"$dir/log" &
pid=$!
up "$sock"; ok "a stale socket is replaced" $?
out=$("$ctl" --socket "$sock" ls); ok "and the entry survived" $(grep -q '^1 entry' <<<"$out"; echo $?)
kill -TERM "$pid"; wait "$pid"; rc=$?; pid=
ok "SIGTERM: exit 0" $([ $rc = 0 ]; echo $?)
ok "SIGTERM: the socket file is removed" $([ ! -e "$sock" ]; echo $?)

# ---- addresses and numbers are checked before anything starts ---------------
# (a refused flag exits 2 and creates no store; `timeout` catches a daemon that
# starts anyway)
refuse() { # WHAT-THE-MESSAGE-SAYS FLAG VALUE
  local want=$1
  shift
  timeout 10 "$daemon" --db "$dir/bad-db" --socket "$dir/bad.sock" "$@" 2>"$dir/bad.err"
  local rc=$?
  ok "$* is a usage error that says '$want'" $([ $rc = 2 ] && grep -q -- "$want" "$dir/bad.err" && [ ! -e "$dir/bad-db" ]; echo $?)
  rm -rf "$dir/bad-db" "$dir/bad.sock"
}
refuse '1 to 65535' --listen :99999
refuse '1 to 65535' --metrics 127.0.0.1:70000
refuse '1 to 65535' --listen 127.0.0.1:0
refuse '1 to 65535' --listen '[::1]:65536'
refuse '1 to 65535' --listen 127.0.0.1:80x
refuse '1 to 65535' --listen 127.0.0.1:
refuse 'HOST:PORT' --metrics nohost
refuse 'numeric' --metrics nohost:9100
refuse 'numeric' --listen 300.1.2.3:7000
refuse 'brackets' --listen ::1:7000
refuse 'token-file' --listen 127.0.0.1:7000
refuse 'token-file' --insecure-tcp --listen 0.0.0.0:7000
refuse '1 to 256' --max-restores 1.5
refuse '1 to 256' --max-restores 2K
# each streaming restore holds one of the store's 512 reader slots, which
# lookups, direct readers and k3cachectl share: past about 500, every lookup
# would fail "too many readers"
refuse "reader slots" --max-restores 257
refuse "reader slots" --max-restores 1000
refuse 'is over --max-restores' --max-restores 4 --max-restores-per-tenant 5
refuse '1 to --max-restores' --max-restores-per-tenant 0
refuse 'at most' --max-bytes 8388609T
# 0 where more is needed: the message says 0 is the trouble, and still what
# the flag takes
refuse 'max-bytes 0: must be more than 0; expected a size such as 64GiB' --max-bytes 0
refuse 'must be more than 0; expected a size such as 1GiB' --max-payload 0KiB
refuse 'must be more than 0; expected a size such as 32MiB' --stage-size 0
refuse 'must be more than 0; expected a size such as 2GiB' --max-inflight 0.0G
refuse 'must be more than 0; expected a duration such as 5m' --idle-timeout 0m
refuse 'stall-timeout 0s: must be more than 0; expected a duration such as 30s' --stall-timeout 0s
refuse 'must be more than 0 (0.5s counts as 0 whole seconds)' --stall-timeout 0.5s
refuse 'must be more than 0; expected a duration such as 1s' --sync-interval 0
refuse 'must be more than 0; expected a size such as 64GiB' --tier2-max-bytes 0
# not a number at all: no word of 0
refuse 'stall-timeout soon: expected a duration such as 30s' --stall-timeout soon
refuse 'a size per second' --min-download-rate fast
refuse 'a size per second' --min-upload-rate slow
refuse 'multiple of 16' --row-block 17
refuse 'multiple of 16' --row-block 8
refuse 'multiple of 16' --row-block 131072

# --row-block makes a new store's blocks that size; a store keeps its own
"$daemon" --db "$dir/rb-db" --socket "$dir/rb.sock" --row-block 128 2>"$dir/rb.log" &
rbpid=$!
up "$dir/rb.sock"
out=$("$ctl" --socket "$dir/rb.sock" stat)
ok "--row-block 128: the new store's row block" $(grep -Eq '^row_block +128( |$)' <<<"$out"; echo $?)
kill "$rbpid"; wait "$rbpid" 2>/dev/null
"$daemon" --db "$dir/rb-db" --socket "$dir/rb.sock" --row-block 256 2>>"$dir/rb.log" &
rbpid=$!
up "$dir/rb.sock"
out=$("$ctl" --socket "$dir/rb.sock" stat)
ok "--row-block 256 on that store: it keeps 128" $(grep -Eq '^row_block +128( |$)' <<<"$out"; echo $?)
ok "--row-block 256 on that store: a warning says so" $(grep -q 'was made with blocks of 128 rows and keeps them' "$dir/rb.log"; echo $?)
kill "$rbpid"; wait "$rbpid" 2>/dev/null

# a block part larger than the receive window allows (blocks of 2048 rows of
# the twin's 3 KiB: 6 MiB parts; stages of 1 MiB: a window of 3 MiB) could
# never be placed, and the publish waited for ever: it is refused at once,
# saying what to change; a part that fits (512 rows, 1.5 MiB) is stored
twin=$shared/models/kimi-k3-0.40b-twin.json
"$daemon" --db "$dir/rbw-db" --socket "$dir/rbw.sock" --row-block 2048 --stage-size 1MiB 2>"$dir/rbw.log" &
rbpid=$!
up "$dir/rbw.sock"
out=$(timeout 20 "$pub" "$dir/rbw.sock" "$twin" N:2048 rbw 2>&1); rc=$?
ok "a block part over the window: refused at once, not a hang (rc $rc: $out)" $([ $rc != 0 ] && [ $rc != 124 ] && grep -q 'block part' <<<"$out" && grep -q -- "--stage-size" <<<"$out"; echo $?)
out=$("$ctl" --socket "$dir/rbw.sock" --json stat)
ok "a block part over the window: nothing stored, nothing in flight, said in the log" $([ "$(json_num entries <<<"$out")" = 0 ] && [ "$(json_num chunks <<<"$out")" = 0 ] && [ "$(json_num inflight_bytes <<<"$out")" = 0 ] && grep -q 'larger than the receive window' "$dir/rbw.log"; echo $?)
ok "stat shows the restore limits: 64, and all but a quarter of them for one tenant" $([ "$(json_num max_restores <<<"$out")" = 64 ] && [ "$(json_num max_restores_per_tenant <<<"$out")" = 48 ]; echo $?)
kill "$rbpid"; wait "$rbpid" 2>/dev/null
"$daemon" --db "$dir/rbw2-db" --socket "$dir/rbw.sock" --row-block 512 --stage-size 1MiB 2>>"$dir/rbw.log" &
rbpid=$!
up "$dir/rbw.sock"
out=$(timeout 20 "$pub" "$dir/rbw.sock" "$twin" N:2048 rbw 2>&1); rc=$?
ok "a block part within the window: stored (rc $rc)" $([ $rc = 0 ]; echo $?)
kill "$rbpid"; wait "$rbpid" 2>/dev/null

# ---- the ready line names what was bound, in human sizes; SIGHUP ------------
log3=$dir/log3
for try in 1 2 3 4 5; do
  p1=$((20000 + RANDOM % 20000)); p2=$((p1 + 1))
  "$daemon" --db "$dir/db3" --socket "$dir/s3.sock" --insecure-tcp --listen ":$p1" --metrics "localhost:$p2" 2>"$log3" &
  pid=$!
  up "$dir/s3.sock" && break
  kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=
done
ok "--listen :PORT logs the address bound, 127.0.0.1:PORT" $(grep -q "ready: .*, tcp 127\.0\.0\.1:$p1," "$log3"; echo $?)
ok "--metrics localhost:PORT logs the URL bound" $(grep -q "ready: .*, metrics http://127\.0\.0\.1:$p2/metrics" "$log3"; echo $?)
out=$("$ctl" --socket "tcp:127.0.0.1:$p1" ping); ok "--listen :PORT answers on 127.0.0.1" $(grep -q '^PONG' <<<"$out"; echo $?)
m=$(http_get 127.0.0.1 "$p2" /metrics); ok "--metrics localhost:PORT serves" $(grep -q '^HTTP/1.[01] 200' <<<"$m"; echo $?)
ok "the ready line gives sizes as people read them" $(grep -q 'ready: .*(0 entries, 0 B of 1\.0 GiB,' "$log3"; echo $?)
ok "no capacity warning for a store under --max-bytes" $(! grep -q 'max-bytes' "$log3"; echo $?)

# --metrics on a port that is taken: the reason, exit 1 like --listen
"$daemon" --db "$dir/db4" --socket "$dir/s4.sock" --metrics "127.0.0.1:$p1" 2>"$dir/m.err"; rc=$?
ok "--metrics on a taken port: exit 1 and the reason" $([ $rc = 1 ] && grep -q -- "--metrics 127.0.0.1:$p1: .*Address already in use" "$dir/m.err"; echo $?)
"$daemon" --db "$dir/db4" --socket "$dir/s4.sock" --insecure-tcp --listen "127.0.0.1:$p2" 2>"$dir/l.err"; rc=$?
ok "--listen on a taken port: exit 1 and the reason" $([ $rc = 1 ] && grep -q -- "--listen 127.0.0.1:$p2: .*Address already in use" "$dir/l.err"; echo $?)

kill -HUP "$pid"
sleep 0.3
"$ctl" --socket "$dir/s3.sock" ping >/dev/null 2>&1; ok "SIGHUP: the daemon still answers" $?
ok "SIGHUP: logged as ignored" $(grep -q 'warn: SIGHUP ignored' "$log3"; echo $?)
kill -TERM "$pid"; wait "$pid"; rc=$?; pid=
ok "SIGTERM after SIGHUP: exit 0, socket removed" $([ $rc = 0 ] && [ ! -e "$dir/s3.sock" ]; echo $?)

if [ -e /proc/net/if_inet6 ] && grep -q '^00000000000000000000000000000001 ' /proc/net/if_inet6; then
  for try in 1 2 3 4 5; do
    p1=$((20000 + RANDOM % 20000)); p2=$((p1 + 1))
    "$daemon" --db "$dir/db3" --socket "$dir/s3.sock" --insecure-tcp --listen "[::1]:$p1" --metrics "[::1]:$p2" 2>"$log3" &
    pid=$!
    up "$dir/s3.sock" && break
    kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=
  done
  ok "--listen [::1]:PORT logs [::1]:PORT" $(grep -q "ready: .*, tcp \[::1\]:$p1," "$log3"; echo $?)
  ok "--metrics [::1]:PORT logs its URL" $(grep -q "ready: .*, metrics http://\[::1\]:$p2/metrics" "$log3"; echo $?)
  m=$(http_get ::1 "$p2" /metrics); ok "--metrics [::1]:PORT serves" $(grep -q '^HTTP/1.[01] 200' <<<"$m"; echo $?)
  kill -TERM "$pid"; wait "$pid"; pid=
else
  echo "skip: no IPv6 loopback"
fi

# ---- directories: only the defaults are created -----------------------------
timeout 10 "$daemon" --db "$dir/sdb" --socket "$dir/nodir/sub/s.sock" 2>"$dir/sd.err"; rc=$?
ok "--socket in a missing directory: exit 1, names it" $([ $rc = 1 ] && grep -q "$dir/nodir/sub.*does not exist" "$dir/sd.err"; echo $?)
ok "--socket in a missing directory: creates neither it nor the store" $([ ! -e "$dir/nodir" ] && [ ! -e "$dir/sdb" ]; echo $?)
K3CACHE_SOCKET=$dir/nodir/s.sock timeout 10 "$daemon" --db "$dir/sdb" 2>"$dir/sd.err"; rc=$?
ok "\$K3CACHE_SOCKET in a missing directory: refused the same way" $([ $rc = 1 ] && grep -q "$dir/nodir.*does not exist" "$dir/sd.err" && [ ! -e "$dir/nodir" ]; echo $?)
timeout 10 "$daemon" --db "$dir/nodir/db" --socket "$dir/sd.sock" 2>"$dir/sd.err"; rc=$?
ok "--db in a missing directory: exit 1, names it, creates nothing" $([ $rc = 1 ] && grep -q "$dir/nodir.*does not exist" "$dir/sd.err" && [ ! -e "$dir/nodir" ]; echo $?)
# the default runtime directory is still made; as root, whose default is
# /run/k3cache, try it as nobody with XDG_RUNTIME_DIR in the test's directory
as=()
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
  as=(setpriv --reuid 65534 --regid 65534 --clear-groups)
  chmod 755 "$dir"
fi
mkdir -m 777 "$dir/u" && mkdir "$dir/u/xdg" && chmod 777 "$dir/u/xdg"
if [ "$(id -u)" != 0 ] || { [ ${#as[@]} -gt 0 ] && "${as[@]}" test -x "$daemon"; }; then
  "${as[@]}" env -u K3CACHE_SOCKET XDG_RUNTIME_DIR="$dir/u/xdg" \
    "$daemon" --db "$dir/u/db" --log-level warn 2>>"$dir/u/log" &
  pid=$!
  up "$dir/u/xdg/k3cache/k3cached.sock"; ok "the default runtime directory is created" $?
  kill -TERM "$pid"; wait "$pid"; pid=
else
  echo "skip: the default runtime directory (root, and no setpriv to run as nobody)"
fi

# ---- under systemd: sd_notify READY once the socket accepts, STOPPING on SIGTERM
python3 - "$dir/notify.sock" "$dir/notify.txt" <<'EOP' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(20)
with open(sys.argv[2], "w") as out:
    try:
        while True:
            m = s.recv(4096).decode()
            out.write(m.replace("\n", " ") + "\n")
            out.flush()
            if "STOPPING=1" in m:
                break
    except socket.timeout:
        pass
EOP
lpid=$!
for _ in $(seq 100); do [ -S "$dir/notify.sock" ] && break; sleep 0.05; done
NOTIFY_SOCKET=$dir/notify.sock "$daemon" --db "$dir/ndb" --socket "$dir/n.sock" 2>>"$dir/log" &
pid=$!
for _ in $(seq 100); do grep -q READY=1 "$dir/notify.txt" 2>/dev/null && break; sleep 0.05; done
ok "sd_notify: READY=1 with a STATUS line" $(grep -q '^READY=1 STATUS=serving .*ndb: 0 entries' "$dir/notify.txt"; echo $?)
"$ctl" --socket "$dir/n.sock" ping >/dev/null 2>&1; ok "sd_notify: the socket accepts once READY is sent" $?
kill -TERM "$pid"; wait "$pid"; pid=
wait "$lpid"
ok "sd_notify: STOPPING=1 on SIGTERM" $(grep -q '^STOPPING=1' "$dir/notify.txt"; echo $?)

# ---- under systemd: journald priorities when stderr is the journal's stream
: >"$dir/j.log"
js=$(stat -c '%d:%i' "$dir/j.log")
JOURNAL_STREAM=$js "$daemon" --db "$dir/jdb" --socket "$dir/j.sock" 2>>"$dir/j.log" &
pid=$!
up "$dir/j.sock"
kill -HUP "$pid"; sleep 0.3
kill -TERM "$pid"; wait "$pid"; pid=
ok "journal stream: info lines start <6>, no timestamp" $(grep -q '^<6>info: k3cached [0-9.]* ready' "$dir/j.log"; echo $?)
ok "journal stream: warnings start <4>" $(grep -q '^<4>warn: SIGHUP ignored' "$dir/j.log"; echo $?)
JOURNAL_STREAM=1:1 "$daemon" --db "$dir/jdb" --socket "$dir/j.sock" 2>"$dir/j2.log" &
pid=$!
up "$dir/j.sock"
kill -TERM "$pid"; wait "$pid"; pid=
ok "another stream's JOURNAL_STREAM: plain lines with the time" $(grep -q '^20[0-9-]*T[0-9:]*Z k3cached info: k3cached [0-9.]* ready' "$dir/j2.log" && ! grep -q '^<' "$dir/j2.log"; echo $?)

# ---- connection errors say what failed; a user's client finds the system daemon
out=$("$ctl" --socket "$dir/none.sock" ping 2>&1)
ok "no socket: says so, no make run hint ($out)" $(grep -q "no socket there: is k3cached running" <<<"$out" && ! grep -q 'make run' <<<"$out"; echo $?)
python3 -c "import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])" "$dir/dead.sock"
out=$("$ctl" --socket "$dir/dead.sock" ping 2>&1)
ok "a socket nothing listens on: says the daemon stopped ($out)" $(grep -q "nothing listens there" <<<"$out"; echo $?)
: > "$dir/plain.file"
out=$("$ctl" --socket "$dir/plain.file" ping 2>&1)
ok "a regular file for a socket: says it is not one ($out)" $(grep -q "that is not a socket" <<<"$out" && ! grep -q "nothing listens" <<<"$out"; echo $?)
rundir_made=
if [ ${#as[@]} -gt 0 ] && [ ! -e /run/k3cache ] && mkdir -m 755 /run/k3cache 2>/dev/null; then
  rundir_made=1
  "$daemon" --db "$dir/sys" --socket /run/k3cache/k3cached.sock --log-level warn 2>>"$dir/log" &
  pid=$!
  up /run/k3cache/k3cached.sock
  # nobody, no daemon of its own (XDG_RUNTIME_DIR empty): the system
  # daemon's socket is dialled, and its mode and group are the reason
  out=$("${as[@]}" env -u K3CACHE_SOCKET XDG_RUNTIME_DIR="$dir/u/xdg" "$ctl" ping 2>&1)
  ok "a user's client dials /run/k3cache/k3cached.sock when it exists ($out)" $(grep -q "unix:/run/k3cache/k3cached.sock" <<<"$out"; echo $?)
  ok "permission denied: names the socket's mode and group" $(grep -q "Permission denied (the socket is mode 0660, group root" <<<"$out"; echo $?)
  kill -TERM "$pid"; wait "$pid"; pid=
  rm -rf /run/k3cache
else
  echo "skip: the system socket as another user (not root, no setpriv, or /run/k3cache exists)"
fi

# ---- a store over --max-bytes at start-up -----------------------------------
twin=$shared/models/kimi-k3-0.40b-twin.json
"$daemon" --db "$dir/cap" --socket "$dir/cap.sock" --log-level warn 2>>"$dir/log" &
pid=$!
up "$dir/cap.sock"
"$pub" "$dir/cap.sock" "$twin" N:40 >/dev/null
"$pub" "$dir/cap.sock" "$twin" N:20 >/dev/null
kill -TERM "$pid"; wait "$pid"; pid=
"$daemon" --db "$dir/cap" --socket "$dir/cap.sock" --max-bytes 500KiB --log-level info 2>"$dir/cap.log" &
pid=$!
up "$dir/cap.sock"
ok "over --max-bytes at start-up: a warning with both sizes" $(grep -q 'warn: .* holds 1\.1 MiB (1155232 bytes), over --max-bytes 500 KiB' "$dir/cap.log"; echo $?)
ok "over --max-bytes at start-up: it says what happens" $(grep -q 'next publish evicts' "$dir/cap.log"; echo $?)
"$pub" "$dir/cap.sock" "$shared/models/tiny-hybrid.json" 1,2,3 >/dev/null
ok "and the next publish does evict down to --max-bytes" $([ "$("$ctl" --socket "$dir/cap.sock" --json stat | json_num bytes)" -le 512000 ]; echo $?)
ok "and the daemon logs what it evicted, with the bytes" $(grep -Eq 'info: evicted [12] least recently used entries \([0-9.]+ [KM]iB\) to make room' "$dir/cap.log"; echo $?)
kill -TERM "$pid"; wait "$pid"; pid=

echo "$pass passed, $fail failed"
[ $fail = 0 ]
