#!/usr/bin/env bash
# make install's layout: programs, header, library with a pkg-config file that
# a program links against, and the systemd unit.
# usage: test_install.sh BUILD_DIR
set -u
build=$1
dir=$(mktemp -d /tmp/k3install-test-XXXXXX)
trap 'rm -rf "$dir"' EXIT
pass=0 fail=0
ok() { if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }
cmake --install "$build" --prefix "$dir/prefix" >/dev/null; ok "cmake --install" $?
for f in bin/k3cachectl bin/k3worker sbin/k3cached include/k3cache/k3cache.h \
         lib/pkgconfig/k3cache.pc lib/systemd/system/k3cached.service; do
  [ -e "$dir/prefix/$f" ]; ok "installs $f" $?
done
cat > "$dir/use.c" <<'EOC'
#include <k3cache.h>
#include <stdio.h>
int main(void)
{
	struct k3cache *c;
	struct k3cache_error e;
	int rc = k3cache_connect("unix:/nonexistent/k3.sock", &c, &e);
	printf("%d %d\n", rc != 0, e.unreachable);
	return 0;
}
EOC
# a sanitized build installs sanitized libraries: link the same way
san=
grep -q '^K3_SANITIZE:BOOL=ON' "$build/CMakeCache.txt" && san="-fsanitize=address,undefined"
# the libraries are static archives only: a plain `pkg-config --libs` (what
# a program's build runs) must name their dependencies too, not just --static
for mode in dynamic static; do
  static=
  [ $mode = static ] && static=--static
  flags=$(PKG_CONFIG_PATH=$dir/prefix/lib/pkgconfig pkg-config --cflags --libs $static k3cache)
  ok "pkg-config --libs $static knows k3cache" $?
  rm -f "$dir/use"
  cc $san "$dir/use.c" $flags -o "$dir/use"
  ok "a program builds against the installed library ($mode pkg-config)" $?
  [ "$("$dir/use")" = "1 1" ]; ok "and runs ($mode pkg-config)" $?
done
echo "$pass passed, $fail failed"
[ $fail = 0 ]
