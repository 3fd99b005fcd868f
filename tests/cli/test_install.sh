#!/usr/bin/env bash
# make install's layout: programs, the public header, libk3cache.so.0 and
# libk3cache.a with a pkg-config file that a program links against both ways,
# the shared library's exports, the systemd unit with the prefix's paths, its
# sysusers.d file, the example /etc/default/k3cached and the man pages.
# usage: test_install.sh BUILD_DIR
set -u
build=$1
dir=$(mktemp -d /tmp/k3install-test-XXXXXX)
trap 'rm -rf "$dir"' EXIT
pass=0 fail=0
ok() { if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }
cmake --install "$build" --prefix "$dir/prefix" >/dev/null; ok "cmake --install" $?
lib=$dir/prefix/lib
for f in bin/k3cachectl bin/k3worker sbin/k3cached include/k3cache/k3cache.h \
         include/k3cache/direct.h lib/libk3cache.so lib/libk3cache.so.0 lib/libk3cache.a \
         lib/libk3cache-direct.so lib/libk3cache-direct.so.0 lib/pkgconfig/k3cache-direct.pc \
         lib/pkgconfig/k3cache.pc lib/systemd/system/k3cached.service lib/sysusers.d/k3cache.conf \
         share/man/man8/k3cached.8 share/man/man1/k3cachectl.1 \
         share/doc/k3cache/examples/default/k3cached share/doc/k3cache/README.md; do
  [ -e "$dir/prefix/$f" ]; ok "installs $f" $?
done
# the unit runs the daemon installed beside it (tests/cli/test_systemd_unit.sh
# checks the rest of it)
grep -q "^ExecStart=$dir/prefix/sbin/k3cached " "$dir/prefix/lib/systemd/system/k3cached.service"
ok "the unit's ExecStart is $dir/prefix/sbin/k3cached" $?
# a staged install (DESTDIR, as a package build does) names the final paths,
# and writes nothing into /etc (an operator's /etc/default/k3cached is theirs)
DESTDIR=$dir/stage cmake --install "$build" --prefix /usr >/dev/null; ok "DESTDIR=... cmake --install --prefix /usr" $?
grep -q '^ExecStart=/usr/sbin/k3cached ' "$dir/stage/usr/lib/systemd/system/k3cached.service"
ok "the staged unit's ExecStart is /usr/sbin/k3cached" $?
[ -z "$(find "$dir/stage" -mindepth 1 -maxdepth 1 ! -name usr)" ]; ok "a staged install writes under its prefix only" $?
# the example /etc/default/k3cached shows every flag an operator may set
# (all but the unit's --db and --socket), each with a value the daemon takes
example=$dir/prefix/share/doc/k3cache/examples/default/k3cached
shown=$(sed -n 's/^#   \(--[a-z].*\)$/\1/p' "$example")
for f in $("$dir/prefix/sbin/k3cached" --help | grep -o -- '--[a-z][a-z0-9-]*' | sort -u); do
  case $f in --db | --socket | --help | --version) continue ;; esac
  grep -q -- "^$f\( \|$\)" <<<"$shown"; ok "the example configuration shows $f" $?
done
# each sample is a flag and its value
"$dir/prefix/sbin/k3cached" $(tr '\n' ' ' <<<"$shown") --help >/dev/null
ok "k3cached takes every flag the example shows, with its sample value" $?
# a range the example gives a flag is the one its --help gives (the example
# said --max-restores 1 to 100000 once the daemon took 1 to 256)
help=$("$dir/prefix/sbin/k3cached" --help)
for f in $(sed -n 's/^#   \(--[a-z][a-z0-9-]*\).*$/\1/p' "$example"); do
  ex=$(awk -v f="$f" '$0 ~ "^#   " f "( |$)" { on = 1; next } /^#   --/ || !/^#/ { on = 0 } on' \
         "$example" | grep -o '[0-9][0-9]* to [0-9][0-9]*' | sort -u)
  hp=$(awk -v f="$f" '$0 ~ "^  " f "( |$)" { on = 1; print; next } /^  --/ { on = 0 } on' \
         <<<"$help" | grep -o '[0-9][0-9]* to [0-9][0-9]*' | sort -u)
  { [ -z "$ex" ] || [ -z "$hp" ]; } && continue
  [ "$ex" = "$hp" ]; ok "the example's $f takes ${ex//$'\n'/, }, as --help says: ${hp//$'\n'/, }" $?
done
for line in "$(grep '^K3CACHED_OPTS=' "$example")" "$(grep '^#K3CACHED_OPTS=' "$example" | cut -c2-)"; do
  opts=$(eval "$line"; echo "$K3CACHED_OPTS")
  # split as systemd splits $K3CACHED_OPTS
  "$dir/prefix/sbin/k3cached" $opts --help >/dev/null; ok "k3cached takes the example's $line" $?
done

# only the public headers: nothing of the project's internals beside them
[ "$(ls "$dir/prefix/include/k3cache" | tr '\n' ' ')" = "direct.h k3cache.h " ]
ok "two headers in include/k3cache" $?

so=$(readlink -f "$lib/libk3cache.so")
objdump -p "$so" | grep -q 'SONAME *libk3cache.so.0$'; ok "SONAME libk3cache.so.0" $?
bad=$(nm -D --defined-only "$so" | awk '{print $3}' | grep -v '^k3cache_')
[ -z "$bad" ]; ok "nm -D: every exported symbol is k3cache_ (found: $(echo $bad | head -c 300))" $?
nm -D --defined-only "$so" | grep -q ' k3cache_restore_arrays$'; ok "exports k3cache_restore_arrays" $?
! nm -D --defined-only "$so" | grep -q ' k3cache_call$'; ok "the raw request call is not exported" $?
! ldd "$so" | grep -q liblmdb; ok "no LMDB in ldd libk3cache.so" $?

# a program of a user's: the header alone, with a model.h of its own beside it
mkdir -p "$dir/app"
cat > "$dir/app/model.h" <<'EOC'
#define USERS_OWN_MODEL_H 1
EOC
cat > "$dir/app/use.c" <<'EOC'
#include "model.h"
#include <k3cache/k3cache.h>
#include <stdio.h>
int main(void)
{
	struct k3cache *c;
	struct k3cache_error e;
	int rc = k3cache_connect("unix:/nonexistent/k3.sock", &c, &e);
	int unreachable = e.unreachable;
	struct k3cache_layer l[2] = {{K3CACHE_MIXER_KDA, 4, 8, 0, 0}, {K3CACHE_MIXER_MLA, 0, 0, 2, 2}};
	struct k3cache_model *m = k3cache_model_new("m", "r", "seed", l, 2, &e);
	printf("%d %d %s %llu %d\n", rc != 0, unreachable, k3cache_code_name(K3CACHE_CORRUPT),
	       (unsigned long long)k3cache_model_blob_size(m, 1, 3), USERS_OWN_MODEL_H);
	k3cache_model_free(m);
	return 0;
}
EOC
want="1 1 CORRUPT 61 1"
# a sanitized build installs sanitized libraries: link the same way
san=
grep -q '^K3_SANITIZE:BOOL=ON' "$build/CMakeCache.txt" && san="-fsanitize=address,undefined"
export PKG_CONFIG_PATH=$lib/pkgconfig
# dynamic: what a program's build runs
flags=$(pkg-config --cflags --libs k3cache); ok "pkg-config --libs knows k3cache" $?
cc $san -Wall -Werror "$dir/app/use.c" -I"$dir/app" $flags -Wl,-rpath,"$lib" -o "$dir/use-dyn"
ok "a program builds against libk3cache.so (pkg-config)" $?
ldd "$dir/use-dyn" | grep -q "$lib/libk3cache.so.0"; ok "and loads the installed libk3cache.so.0" $?
[ "$("$dir/use-dyn")" = "$want" ]; ok "and runs (dynamic)" $?
# C++: the header compiles as C++ and its functions link as extern "C"
if command -v c++ >/dev/null; then
  c++ $san -Wall -Werror -x c++ "$dir/app/use.c" -x none -I"$dir/app" $flags -Wl,-rpath,"$lib" -o "$dir/use-cxx"
  ok "a C++ program builds against libk3cache.so" $?
  [ "$("$dir/use-cxx")" = "$want" ]; ok "and runs (C++)" $?
fi
# static: libk3cache.a, with the private dependencies --static names
flags=$(pkg-config --cflags --libs --static k3cache | sed 's/-lk3cache\b/-l:libk3cache.a/')
ok "pkg-config --static --libs knows k3cache" $?
cc $san -Wall -Werror "$dir/app/use.c" -I"$dir/app" $flags -o "$dir/use-static"
ok "a program builds against libk3cache.a (pkg-config --static)" $?
! ldd "$dir/use-static" | grep -q libk3cache; ok "and needs no libk3cache.so" $?
[ "$("$dir/use-static")" = "$want" ]; ok "and runs (static)" $?
# direct reads: libk3cache-direct.so.0 exports its own calls only, and a
# program built with pkg-config k3cache-direct restores, from the store
# itself, what it published through an installed daemon
dso=$(readlink -f "$lib/libk3cache-direct.so")
objdump -p "$dso" | grep -q 'SONAME *libk3cache-direct.so.0$'; ok "SONAME libk3cache-direct.so.0" $?
bad=$(nm -D --defined-only "$dso" | awk '{print $3}' | grep -v '^k3cache_direct_')
[ -z "$bad" ]; ok "nm -D: libk3cache-direct exports only k3cache_direct_ (found: $(echo $bad | head -c 300))" $?
cat > "$dir/app/direct.c" <<'EOC'
#include <k3cache/direct.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv)
{
	struct k3cache *c;
	struct k3cache_direct *d;
	struct k3cache_error e;
	struct k3cache_layer l[2] = {{K3CACHE_MIXER_KDA, 4, 8, 0, 0}, {K3CACHE_MIXER_MLA, 0, 0, 2, 2}};
	struct k3cache_model *m = k3cache_model_new("m", "r", "seed", l, 2, &e);
	float conv[4] = {1, 2, 3, 4}, rec[8] = {5, 6, 7, 8, 9, 10, 11, 12};
	float k[6] = {.5f, 1, 2, 3, 4, 5}, v[6] = {6, 7, 8, 9, 10, 11};
	struct k3cache_arrays in[2] = {{conv, 4, rec, 8}, {k, 6, v, 6}};
	uint32_t t[4] = {7, 8, 9, 10}, p = 0;
	struct k3cache_publish_result pr;
	struct k3cache_lookup_result lr;
	if (k3cache_connect(argv[2], &c, &e) || k3cache_put_model(c, m, NULL, &e) ||
	    k3cache_publish_arrays(c, m, NULL, 0, t, 3, in, 2, NULL, 0, &pr, &e) ||
	    k3cache_direct_open(argv[1], argv[2], &d, &e) ||
	    k3cache_direct_lookup(d, k3cache_model_fingerprint(m), NULL, 0, t, 4, 0, &lr, &e)) {
		printf("error: %s\n", e.message);
		return 1;
	}
	float conv2[4], rec2[8], k2[6], v2[6];
	struct k3cache_arrays_out out[2] = {{conv2, 4, rec2, 8}, {k2, 6, v2, 6}};
	int rc = k3cache_direct_restore_arrays(d, m, lr.key, out, 2, &p, &e);
	printf("%d %u %u %d\n", rc, lr.prefix_len, p,
	       !memcmp(conv, conv2, sizeof(conv)) && !memcmp(rec, rec2, sizeof(rec)) &&
	               !memcmp(k, k2, sizeof(k)) && !memcmp(v, v2, sizeof(v)));
	k3cache_direct_close(d);
	k3cache_close(c);
	k3cache_model_free(m);
	return argc == 3 ? 0 : 1;
}
EOC
flags=$(pkg-config --cflags --libs k3cache-direct); ok "pkg-config --libs knows k3cache-direct ($flags)" $?
cc $san -Wall -Werror "$dir/app/direct.c" $flags -Wl,-rpath,"$lib" -o "$dir/use-direct"
ok "a program builds against libk3cache-direct.so (pkg-config)" $?
ldd "$dir/use-direct" | grep -q "$lib/libk3cache-direct.so.0"; ok "and loads the installed libk3cache-direct.so.0" $?
mkdir -p "$dir/db"
"$dir/prefix/sbin/k3cached" --db "$dir/db" --socket "$dir/k3.sock" >"$dir/k3cached.log" 2>&1 &
kpid=$!
for _ in $(seq 400); do [ -S "$dir/k3.sock" ] && break; sleep 0.05; done
got=$("$dir/use-direct" "$dir/db" "unix:$dir/k3.sock")
[ "$got" = "0 3 3 1" ]; ok "and restores from the store what it published ($got)" $?
kill "$kpid"; wait "$kpid" 2>/dev/null

# the Python package, beside the library it loads (no K3CACHE_LIBRARY)
site=$(ls -d "$lib"/python3.*/dist-packages 2>/dev/null | head -1)
[ -f "$site/k3cache/__init__.py" ]; ok "installs the Python package (lib/python3.X/dist-packages/k3cache)" $?
if [ -z "$san" ]; then # an ASan library cannot be loaded into python3
  got=$(cd "$dir" && env -u K3CACHE_LIBRARY PYTHONPATH="$site" /usr/bin/python3 -c '
import k3cache, k3cache._lib as l
try:
    k3cache.Client("unix:/nonexistent/k3.sock")
except k3cache.InternalError as e:
    print(l.lib._name, e.unreachable)')
  [ "$got" = "$lib/libk3cache.so.0 True" ]; ok "import k3cache loads the installed library ($got)" $?
  got=$(cd "$dir" && env -u K3CACHE_LIBRARY -u K3CACHE_DIRECT_LIBRARY PYTHONPATH="$site" \
        /usr/bin/python3 -c 'import k3cache._lib as l; print(l.direct().path)')
  [ "$got" = "$lib/libk3cache-direct.so.0" ]; ok "k3cache.Direct loads the installed libk3cache-direct ($got)" $?
fi
echo "$pass passed, $fail failed"
[ $fail = 0 ]
