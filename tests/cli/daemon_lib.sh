# Sourced by the CLI tests that run one k3cached: needs $daemon, $ctl, $dir
# and $sock set; gives ok (counts pass and fail), start (the daemon on $dir/db
# and $sock, its log in $dir/log, up once it answers a ping), stop (SIGTERM,
# waited for) and a cleanup on exit (SIGKILL, $dir removed unless KEEP).
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$dir"; }
trap cleanup EXIT
pass=0 fail=0
ok() { if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }
start() {
  "$daemon" --db "$dir/db" --socket "$sock" --log-level info 2>>"$dir/log" &
  pid=$!
  for _ in $(seq 100); do "$ctl" --socket "$sock" ping >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "daemon did not start"; cat "$dir/log"; exit 1
}
stop() { kill -TERM "$pid"; wait "$pid" 2>/dev/null; pid=; }
