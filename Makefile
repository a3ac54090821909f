# Thin wrapper for the README's commands. Each target installs missing dependencies first
# (cmake/install-deps.sh: apt-get as root, sudo otherwise), then configures a CMake preset.

JOBS ?= $(shell nproc 2>/dev/null || echo 2)

# ccache (the presets' compiler launcher) shares its cache between clones of the repository:
# paths below the clone are hashed relative to it, and the working directory is not hashed.
export CCACHE_BASEDIR ?= $(CURDIR)
export CCACHE_NOHASHDIR ?= true

.PHONY: demo demo-deps tree-demo tools sim campaign test asan tsan fuzz bench format lint deps clean package package-check

# Configure, build and run the tests of one CMake preset.
define preset_tests
	@cmake --preset $(1) >/dev/null
	@cmake --build --preset $(1) -j $(JOBS)
	@ctest --preset $(1) -j $(JOBS)
endef

deps:
	@sh cmake/install-deps.sh

# What the demos build and run: a compiler, cmake and the four header libraries, no test tools.
demo-deps:
	@sh cmake/install-deps.sh demo

## Run the main job: a local capacity tree (root + 2 intermediates) with worker processes.
demo: demo-deps
	@cmake --preset demo >/dev/null
	@cmake --build --preset demo -j $(JOBS) --target doorman-client-demo-all
	@./build/demo/examples/doorman-client-demo

## The protocol-level tree demo: the same tree with six scripted JSON-RPC clients.
tree-demo: demo-deps
	@cmake --preset demo >/dev/null
	@cmake --build --preset demo -j $(JOBS) --target doorman-tree-demo-all
	@./build/demo/examples/doorman-tree-demo

## The programs alone, for the Python and Envoy docs: doorman-node, doorman (the CLI),
## doorman-sim and doorman-rls in build/tools/examples, without the tests (docs/python.md).
tools:
	@sh cmake/install-deps.sh tools
	@cmake --preset tools >/dev/null
	@cmake --build --preset tools -j $(JOBS) --target doorman-node doorman-cli doorman-sim doorman-rls
	@echo "built: build/tools/examples/doorman-node build/tools/examples/doorman build/tools/examples/doorman-sim build/tools/examples/doorman-rls"

# Doorman's convergence scenarios on the simulator: charts and CSVs in build/sim/.
sim: demo-deps
	@cmake --preset release >/dev/null
	@cmake --build --preset release -j $(JOBS) --target doorman-sim
	@./build/release/examples/doorman-sim --scenario all --out build/sim

## The seeded fault campaign (docs/simulation.md): SEEDS seeds from FIRST_SEED, MINUTES each.
FIRST_SEED ?= 1
SEEDS ?= 40
MINUTES ?= 500
campaign: demo-deps
	@cmake --preset release >/dev/null
	@cmake --build --preset release -j $(JOBS) --target doorman-sim
	@./build/release/examples/doorman-sim --campaign $(FIRST_SEED) --seeds $(SEEDS) --minutes $(MINUTES)

## Build and run the test suite (Debug, warnings as errors).
test: deps
	$(call preset_tests,dev)

## Debian packages doorman and doorman-dev in build/release/packages (docs/deployment.md).
package: deps
	@sh cmake/install-deps.sh package
	@cmake --preset release >/dev/null
	@cmake --build --preset release -j $(JOBS)
	@cd build/release && cpack -G DEB

## Install the packages, check them as an operator would, remove them (root; CI runs it).
package-check: package
	@sh deploy/debian/check_package.sh

## The test suite under AddressSanitizer + UndefinedBehaviorSanitizer.
asan: deps
	$(call preset_tests,asan)

## The test suite under ThreadSanitizer.
tsan: deps
	$(call preset_tests,tsan)

## The libFuzzer targets (clang-16, ASan + UBSan), each for FUZZ_SECONDS, two at a time (docs/fuzzing.md).
FUZZ_SECONDS ?= 60
fuzz:
	@sh cmake/install-deps.sh fuzz
	@cmake --preset fuzz >/dev/null
	@cmake --build --preset fuzz -j $(JOBS)
	@sh tests/fuzz/run.sh $(FUZZ_SECONDS)

## Benchmarks (Release), JSON written to build/release/{decision,load,limiter}.json.
bench: deps
	@cmake --preset release >/dev/null
	@cmake --build --preset release -j $(JOBS) --target doorman_bench_decision doorman_bench_load doorman_bench_limiter doorman_bench_algorithms
	@./build/release/benchmarks/doorman_bench_decision --benchmark_repetitions=5 \
	  --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true \
	  --benchmark_out=build/release/decision.json --benchmark_out_format=json
	@./build/release/benchmarks/doorman_bench_load --json build/release/load.json
	@./build/release/benchmarks/doorman_bench_limiter --json build/release/limiter.json
	@./build/release/benchmarks/doorman_bench_algorithms --json build/release/algorithms.json

## Format every C++ file with clang-format.
format:
	@clang-format -i $$(git ls-files '*.hpp' '*.ipp' '*.cpp')

## Style checks: clang-format clean, and no function in include/, src/ or examples/ longer than
## 60 lines.
lint:
	@sh cmake/install-deps.sh lint
	@git ls-files '*.hpp' '*.ipp' '*.cpp' | xargs clang-format --dry-run --Werror
	@echo "clang-format: clean"
	@sh .ci/function-lengths 60

clean:
	@rm -rf build
