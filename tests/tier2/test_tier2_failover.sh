#!/usr/bin/env bash
# Tier 2 across a failover (issue 17; the README's advice to run replicas):
# a real Redis Cluster of 3 masters with a replica each, and two k3cached
# daemons sharing it. A master holding part of the entries is SIGKILLed;
# once its replica has taken over, the entries it held are found again by a
# daemon that was running all along (its slot map refreshed, never
# restarted) and by one started afterwards, and the restored output equals
# --no-cache's. Copies made after the failover land in the cluster.
# usage: test_tier2_failover.sh BUILD_DIR SRC_DIR
# Without redis-server and redis-cli: skipped (77).
set -u
build=$1 src=$2
# shellcheck source=cluster_lib.sh
. "$src/tests/tier2/cluster_lib.sh"

pick_ports 6
for i in 0 1 2 3 4 5; do start_node "$i"; done
create_cluster 1 0 1 2 3 4 5
seeds="redis://127.0.0.1:${port[0]},127.0.0.1:${port[1]},127.0.0.1:${port[2]}"
role_of() { redis-cli -p "${port[$1]}" role 2>/dev/null | head -1; }
masters=() replicas=()
for i in 0 1 2 3 4 5; do
  if [ "$(role_of "$i")" = master ]; then masters+=("$i"); else replicas+=("$i"); fi
done
ok "3 masters (${masters[*]}) and 3 replicas (${replicas[*]})" $([ ${#masters[@]} = 3 ] && [ ${#replicas[@]} = 3 ]; echo $?)
# every replica's link up
for i in "${replicas[@]}"; do
  for _ in $(seq 200); do
    redis-cli -p "${port[$i]}" info replication | grep -q 'master_link_status:up' && break
    sleep 0.1
  done
done
# replicated: each master's replica has everything the master has
replicated() {
  local m off
  for m in "${masters[@]}"; do
    for _ in $(seq 200); do
      off=$(redis-cli -p "${port[$m]}" info replication | tr -d '\r' | sed -n 's/^master_repl_offset://p')
      redis-cli -p "${port[$m]}" info replication | tr -d '\r' | grep -q "^slave0:.*,offset=$off," && break
      sleep 0.05
    done
    redis-cli -p "${port[$m]}" info replication | tr -d '\r' | grep -q "^slave0:.*,offset=$off," || return 1
  done
}

start_daemon a
start_daemon b --tier2-mode read-only
"$worker" --conversation "$conv" --no-cache > "$dir/ref" 2>"$dir/ref.err"; ok "reference run" $?

# ---- turns 1-3 on a, copied, replicated -----------------------------------------------
out=$dir/fo
: > "$out"
for k in 1 2 3; do
  turn a "$k" "$out" failover
  wait_copies a "$k"; ok "turn $k on a: copied" $?
done
replicated; ok "every replica has caught up with its master" $?
# b reads the cluster before the failover: its slot map names the master to be killed
"$ctl" --socket "$dir/b.sock" --json ls --tier2 > "$dir/ls.before"
nb=$(python3 -c 'import json,sys; print(len(json.load(sys.stdin)["entries"]))' < "$dir/ls.before")
# turn 1's system-prompt entry and the three turns
ok "b lists the cluster's $nb entries before the failover" $([ "$nb" -ge 3 ]; echo $?)

# ---- the master holding the most of them dies -----------------------------------------
victim=${masters[0]} most=-1
for m in "${masters[@]}"; do
  n=$(redis-cli -p "${port[$m]}" dbsize)
  [ "$n" -gt "$most" ] && { most=$n; victim=$m; }
done
vid=$(redis-cli -p "${port[$victim]}" cluster myid)
kill -9 "${pids[$victim]}"; wait "${pids[$victim]}" 2>/dev/null; pids[$victim]=
survivors=()
for i in 0 1 2 3 4 5; do [ "$i" != "$victim" ] && survivors+=("$i"); done
t0=$(date +%s%N)
# the survivors agree on its FAIL (not PFAIL: "fail?"), three masters serve
# every slot, and every survivor says cluster_state:ok
failed_over() {
  local s=${survivors[0]} nodes
  nodes=$(redis-cli -p "${port[$s]}" cluster nodes) || return 1
  awk -v id="$vid" '$1 == id && $3 ~ /(^|,)fail(,|$)/ { f = 1 } END { exit !f }' <<<"$nodes" &&
    [ "$(awk '$3 ~ /master/ && $3 !~ /fail/ && NF >= 9 { n++ } END { print n + 0 }' <<<"$nodes")" = 3 ] &&
    cluster_ok "${survivors[@]}"
}
for _ in $(seq 300); do failed_over && break; sleep 0.1; done
failed_over; ok "master $victim ($most keys) SIGKILLed: its replica took over in $((($(date +%s%N) - t0) / 1000000)) ms" $?
newm=0
for i in "${survivors[@]}"; do [ "$(role_of "$i")" = master ] && newm=$((newm + 1)); done
ok "3 masters again" $([ $newm = 3 ]; echo $?)

# ---- the running daemon b finds the entries again (never restarted) ---------------------
errs0=$(stat_of b tier2_node_errors)
cp "$out.replies" "$dir/b4.replies"
: > "$dir/b4"
turn b 4 "$dir/b4" failover
r=$(reuse_of "$dir/b4" 1)
ok "after the failover, b (running all along) restores turn 3's state from the cluster ($r tokens)" $([ "${r:-0}" -gt 100 ]; echo $?)
diff <(answers "$dir/ref" | sed -n '/== turn 4/,$p') <(answers "$dir/b4") >/dev/null
ok "after the failover, b's turn 4 equals --no-cache" $?
ok "b: a fetch and a hit" $([ "$(stat_of b tier2_fetches)" -ge 1 ] && [ "$(stat_of b tier2_hits)" -ge 1 ]; echo $?)
ok "b: no miss by damage" $([ "$(stat_of b tier2_misses_damaged)" = 0 ]; echo $?)
ok "b: the commands its dead master did not answer were sent to its successor ($(stat_of b tier2_resent))" $([ "$(stat_of b tier2_resent)" -ge 1 ]; echo $?)
echo "b's node errors: $errs0 before its turn, $(stat_of b tier2_node_errors) after"
"$ctl" --socket "$dir/b.sock" --json ls --tier2 > "$dir/ls.after"
na=$(python3 -c 'import json,sys; print(len(json.load(sys.stdin)["entries"]))' < "$dir/ls.after")
ok "b lists the same $na entries after the failover" $([ "$na" = "$nb" ]; echo $?)

# ---- a daemon started after the failover, and copies after it ------------------------------
start_daemon c --tier2-mode read-only
cp "$out.replies" "$dir/c4.replies"
: > "$dir/c4"
turn c 4 "$dir/c4" failover
r=$(reuse_of "$dir/c4" 1)
ok "a daemon started after the failover restores from the cluster ($r tokens)" $([ "${r:-0}" -gt 100 ]; echo $?)
turn a 4 "$out" failover
wait_copies a 4; ok "a's copy after the failover reached the cluster" $?
diff <(answers "$dir/ref") <(answers "$out") >/dev/null
ok "a's four turns equal --no-cache" $?
ok "every daemon is up" $(kill -0 "${dpid[a]}" && kill -0 "${dpid[b]}" && kill -0 "${dpid[c]}"; echo $?)
stop_daemons a b c

echo "tier2 failover: $pass passed, $fail failed"
[ $fail = 0 ]
