#!/usr/bin/env bash
# The messages of the library, the daemon and k3cachectl name what a user can
# look up: no string in their sources names one of the project's internal
# functions (model_layer_blob_size where the caller has
# k3cache_model_blob_size). Internal: a function defined in src/, client/,
# daemon/ or ctl/ that the library's headers (the public ones, and
# k3cache_raw.h for the project's own tools) do not declare.
# usage: test_message_names.sh SRC_DIR
set -u
src=$1
tmp=$(mktemp -d /tmp/k3-names-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
files=$(find "$src/src" "$src/client" "$src/daemon" "$src/ctl" -name '*.c' | sort)
# a definition starts its line: "type name(" or "type *name("
grep -hoE '^[a-z][a-zA-Z0-9_ ]*[ *]([a-z][a-z0-9]*_[a-z0-9_]+)\(' $files |
  sed -E 's/.*[ *]([a-z0-9_]+)\($/\1/' | sort -u > "$tmp/defined"
grep -hoE '\bk3cache_[a-z0-9_]+' "$src"/client/include/k3cache/*.h "$src/client/k3cache_raw.h" |
  sort -u > "$tmp/public"
comm -23 "$tmp/defined" "$tmp/public" > "$tmp/internal"
fail=0
if [ "$(wc -l < "$tmp/internal")" -lt 100 ]; then
  echo "FAIL: found only $(wc -l < "$tmp/internal") internal functions: the scan is broken"
  fail=1
fi
# every string literal but a file's path ("/proc/.../boot_id"), then where
for f in $files; do
  grep -noE '"([^"\\]|\\.)*"' "$f" | grep -v '^[0-9]*:"/' | while IFS= read -r hit; do
    printf '%s\t%s:%s\n' "${hit#*:}" "${f#"$src"/}" "${hit%%:*}"
  done
done > "$tmp/literals"
cut -f1 "$tmp/literals" > "$tmp/text"
found=$(grep -nwFf "$tmp/internal" "$tmp/text" | cut -d: -f1)
for n in $found; do
  line=$(sed -n "${n}p" "$tmp/literals")
  name=$(cut -f1 <<<"$line" | grep -owFf "$tmp/internal" | head -1)
  echo "FAIL: $(cut -f2 <<<"$line"): a message names the internal $name: $(cut -f1 <<<"$line")"
  fail=1
done
[ $fail = 0 ] && echo "message names: no internal function named in $(wc -l < "$tmp/literals") strings"
exit $fail
