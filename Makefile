# Wrappers for a newcomer: each target installs what is missing, configures,
# builds and runs. CMake does the real work; see CMakeLists.txt.
JOBS ?= 2
SHARED ?= $(abspath ../shared)
FUZZ_SECONDS ?= 30

.PHONY: all deps build asan fuzz-build test run demo bench format lint install clean

all: build

deps:
	@bash scripts/install-deps

build: deps
	@cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DK3_SHARED_DIR=$(SHARED) >/dev/null
	@cmake --build build -j$(JOBS)

asan: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DK3_SANITIZE=ON -DK3_SHARED_DIR=$(SHARED) >/dev/null
	@cmake --build build-asan -j$(JOBS)

fuzz-build: deps
	@cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DK3_FUZZ=ON -DK3_SHARED_DIR=$(SHARED) >/dev/null
	@cmake --build build-fuzz -j$(JOBS) --target fuzz_targets

# Normal build + ctest, ASan/UBSan build + ctest, then every fuzz target.
test: build asan fuzz-build
	@bash scripts/test-all $(SHARED) $(FUZZ_SECONDS)

# Runs the daemon in the foreground on its default store and socket
# (root: /var/lib/k3cache and /run/k3cache; a user: XDG directories).
# RUN_ARGS adds flags, e.g. make run RUN_ARGS="--max-bytes 8GiB"; the
# commands it prints for another terminal export a --socket of RUN_ARGS as
# K3CACHE_SOCKET (scripts/run).
run: build
	@exec bash scripts/run build $(RUN_ARGS)

# A three-turn conversation, each turn in a new worker process, on a
# temporary store; shows k3cachectl ls and stops the daemon.
demo: build
	@bash scripts/demo build

bench: build
	@build/bench/bench_blob
	@build/bench/bench_store build/bench-store.tmp
	@if [ -x build/bench/bench_wire ]; then build/bench/bench_wire build/bench-wire.tmp; fi
	@if [ -x build/bench/bench_redis ]; then build/bench/bench_redis build/bench-redis.tmp; fi
	@if [ -x build/bench/bench_tier2 ]; then build/bench/bench_tier2 build/bench-tier2.tmp; fi
	@/usr/bin/python3 bench/python_restore.py build
	@bash bench/worker.sh build
	@bash bench/conversation.sh build
	@build/bench/bench_k3conv build/bench-k3conv.tmp

PREFIX ?= /usr/local
install: build
	@cmake --install build --prefix $(PREFIX)

format:
	@clang-format -i $$(git ls-files '*.c' '*.h')

lint: build
	@bash scripts/lint

clean:
	rm -rf build build-asan build-fuzz
