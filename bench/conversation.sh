#!/usr/bin/env bash
# bench/conversation: what the store holds and what the daemon receives for
# k3worker --model twin conversations, every turn in a new worker process,
# against the ideal (issue 12, section 5):
#   ideal = every stored entry's KDA layers (and each MLA blob's 13-byte
#           header) + one copy of the MLA rows of every distinct token position,
# where the distinct positions are the distinct (model, salt, tokens[0..i])
# prefixes over all stored entries (the nodes of their token trie).
# Everything comes from the store: entries and tokens from `ls` and
# `inspect`, k_row and v_row from the spec each entry was published under
# (`models`: k3worker-twin, 128 + 32 floats a row; not the fixture
# kimi-k3-0.40b-twin.json, whose 768 + 512 would make the ideal's rows 8x).
# The conversation: a system prompt and 10 turns; a branch shares its first
# BRANCH_AT turns, then diverges for BRANCH_TURNS turns of its own.
# A benchmark: it prints figures and exits 0 whatever the ratios.
# usage: bench/conversation.sh BUILD_DIR
set -eu
build=${1:-build}
TURNS=10 BRANCH_AT=4 BRANCH_TURNS=3
dir=$(mktemp -d /tmp/k3bench-conv-XXXXXX)
sock=$dir/k3cached.sock
pid=
cleanup() {
	if [ -n "$pid" ]; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
"$build/daemon/k3cached" --db "$dir/db" --socket "$sock" --log-level warn 2>"$dir/log" &
pid=$!
export K3CACHE_SOCKET=$sock
ctl() { "$build/client/k3cachectl" "$@"; }
for _ in $(seq 100); do ctl ping >/dev/null 2>&1 && break; sleep 0.05; done

# deterministic text, as in bench/worker.sh
words=(the cache keeps attention state warm across worker processes and restarts
       so that a long prompt is not recomputed on each turn of a conversation while
       recurrent layers resume exactly where the stored prefix ends)
text() { local n=$1 s=$2 out="" i; for ((i = 0; i < n; i++)); do out+="${words[$(((i * 7 + s) % ${#words[@]}))]} "; done; printf '%s' "$out"; }
# main: a system prompt and TURNS user turns; branch: the same system prompt
# and first BRANCH_AT turns, then turns of its own
{
	printf 'System: %s\n\n' "$(text 150 1)"
	for ((t = 1; t <= TURNS; t++)); do printf '%s\n\n' "$(text 40 "$((t + 1))")"; done
} >"$dir/main.txt"
{
	printf 'System: %s\n\n' "$(text 150 1)"
	for ((t = 1; t <= BRANCH_AT; t++)); do printf '%s\n\n' "$(text 40 "$((t + 1))")"; done
	for ((t = BRANCH_AT + 1; t <= BRANCH_AT + BRANCH_TURNS; t++)); do
		printf '%s\n\n' "$(text 40 "$((t + 17))")"
	done
} >"$dir/branch.txt"

# every turn in a new process; the replies file carries earlier replies
w() {
	"$build/tools/k3worker" --model twin --conversation "$1" --turn "$2" --replies "$3" --quiet \
		>>"$dir/out" 2>&1 || { tail -n 20 "$dir/out" >&2; exit 1; }
}
now() { date +%s.%N; }
t0=$(now)
for ((t = 1; t <= TURNS; t++)); do w "$dir/main.txt" "$t" "$dir/main.replies"; done
head -n "$BRANCH_AT" "$dir/main.replies" >"$dir/branch.replies"
for ((t = BRANCH_AT + 1; t <= BRANCH_AT + BRANCH_TURNS; t++)); do w "$dir/branch.txt" "$t" "$dir/branch.replies"; done
t1=$(now)
warnings=$(grep -c '^\[CACHE\] warning' "$dir/out" || true)

# the daemon's counters first (the listing below adds to bytes_in), then
# every entry, layer by layer, and the model specs they were published under
ctl --json stat >"$dir/stat.json"
ctl --json ls --limit 100000 >"$dir/ls.json"
ctl --json models >"$dir/models.json"
mkdir "$dir/entries"
python3 -c 'import json, sys; [print(e["key"]) for e in json.load(open(sys.argv[1]))["entries"]]' \
	"$dir/ls.json" >"$dir/keys"
while read -r key; do ctl --json inspect "$key" >"$dir/entries/$key.json"; done <"$dir/keys"

echo "bench/conversation: k3worker --model twin, $TURNS turns + a branch of $BRANCH_TURNS after turn $BRANCH_AT, a process per turn"
python3 - "$dir" "$(awk "BEGIN { print $t1 - $t0 }")" "$warnings" <<'EOF'
import glob, json, os, sys

d, seconds, warnings = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
stat = json.load(open(os.path.join(d, "stat.json")))
listing = json.load(open(os.path.join(d, "ls.json")))
specs = {m["fingerprint"]: m["spec"] for m in json.load(open(os.path.join(d, "models.json")))}
entries = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(d, "entries", "*.json")))]
problems = []
if len(entries) != listing["total_entries"] or len(entries) != stat["entries"]:
    problems.append("inspected %d entries; ls says %d, stat %d"
                    % (len(entries), listing["total_entries"], stat["entries"]))

# per entry: everything but the MLA rows (KDA layers, MLA headers);
# per (model, salt): the token sequences, for the distinct prefixes
entry_part = 0
row_bytes = {}  # fingerprint -> bytes of one token position over all MLA layers
seqs = {}
for e in entries:
    fp, p = e["fingerprint"], e["prefix_len"]
    layers = specs[fp]["layers"]
    rb = sum((l["k_row"] + l["v_row"]) * 4 for l in layers if l["mixer"] == "mla")
    row_bytes[fp] = rb
    for l in e["layers"]:
        s = layers[l["index"]]
        if l["mixer"] == "MLA":
            rows = l["seq_len"] * (s["k_row"] + s["v_row"]) * 4
            if l["seq_len"] != p or l["bytes"] - rows != 13:
                problems.append("%s layer %d: seq_len %d, %d bytes, not %d + 13"
                                % (e["key"][:16], l["index"], l["seq_len"], l["bytes"], rows))
            entry_part += l["bytes"] - rows
        else:
            entry_part += l["bytes"]
    if len(e["tokens"]) != p:
        problems.append("%s: %d tokens, prefix_len %d" % (e["key"][:16], len(e["tokens"]), p))
    seqs.setdefault((fp, e["salt"]), []).append(tuple(e["tokens"]))

# distinct prefixes of sorted sequences: each adds its length minus its
# longest common prefix with the one before it (which is the longest with any)
positions = 0
row_part = 0
for (fp, _salt), ss in seqs.items():
    ss = sorted(set(ss))
    n = 0
    prev = ()
    for s in ss:
        lcp = 0
        while lcp < min(len(s), len(prev)) and s[lcp] == prev[lcp]:
            lcp += 1
        n += len(s) - lcp
        prev = s
    positions += n
    row_part += n * row_bytes[fp]
ideal = entry_part + row_part

stored, logical, received = stat["bytes"], stat["logical_bytes"], stat["bytes_in"]
r_stored, r_recv = stored / ideal, received / ideal
mib = lambda b: "%.1f MiB" % (b / 1048576)
print("%-44s %12s  %s" % ("figure", "measured", "target"))
print("%-44s %11.2fx  <= 1.1x: %s" % ("stored bytes / ideal", r_stored, "met" if r_stored <= 1.1 else "NOT met"))
print("%-44s %11.2fx  <= 1.3x: %s" % ("bytes received over the socket / ideal", r_recv, "met" if r_recv <= 1.3 else "NOT met"))
print()
print("%-44s %12s  %s" % ("counter", "value", ""))
for name, v, note in [
        ("stored bytes (stat bytes)", stored, mib(stored)),
        ("logical bytes (entries whole)", logical, "%s, %.2fx ideal" % (mib(logical), logical / ideal)),
        ("ideal", ideal, mib(ideal)),
        ("  entries' KDA layers + MLA headers", entry_part, mib(entry_part)),
        ("  MLA rows of distinct positions", row_part, "%d positions x %s B" % (positions, "/".join(str(v) for v in sorted(set(row_bytes.values()))))),
        ("bytes received (stat bytes_in)", received, mib(received)),
        ("entries", stat["entries"], ""),
        ("blocks", stat["blocks"], "of %d rows" % stat["row_block"]),
        ("blocks_mismatched", stat["blocks_mismatched"], ""),
        ("publishes (of them already stored)", stat["publishes"], "(%d)" % stat["publishes_existing"]),
        ("evictions", stat["evictions"], ""),
]:
    print("%-44s %12d  %s" % (name, v, note))
print("%-44s %11.1fs  %s" % ("worker processes, wall time", seconds, ""))
if warnings:
    problems.append("%d worker cache warnings" % warnings)
for p in problems:
    print("note: " + p)
EOF
