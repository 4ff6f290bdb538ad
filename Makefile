# A thin front to CMake. Builds live in build/ (release), build-asan/ (ASan+UBSan) and
# build-tsan/ (ThreadSanitizer).
#   make          release build of the library and the sdpa command
#   make test     build everything, run all tests (release, the AMX table emulated, then
#                 ASan+UBSan, then TSan)
#   make deps     install what the optional parts need when missing (Open MPI for
#                 libsdpa_mpi, from Debian, as root); make and make test run it first
#   make demo     the worked example, step by step
#   make memcheck the unit tests under valgrind; make fuzz: the libFuzzer targets
#   make bench    time the forward at the quick shapes (PRESET=full for the target shapes;
#                 BENCH_ARGS="--threads 2 --json out.json" passes options to sdpa bench)
#   make install  PREFIX=/usr/local (DESTDIR honoured)
#   make format   apply .clang-format to the sources

BUILD      ?= build
ASAN_BUILD ?= build-asan
PREFIX     ?= /usr/local
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
CTEST_FLAGS ?= --output-on-failure
PRESET     ?= quick
BENCH_ARGS ?=

TSAN_BUILD ?= build-tsan
EMU_BUILD  ?= build-amx-emulated

.PHONY: all deps build test test-release test-amx-emulated test-asan test-tsan memcheck demo bench install format clean fuzz

all: build

# Open MPI (libopenmpi-dev, openmpi-bin) for libsdpa_mpi and its tests: installed with apt-get
# where we are root and it is missing; elsewhere a note, and the build goes on without it.
deps:
	@if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "make: installing Open MPI (libopenmpi-dev openmpi-bin) for libsdpa_mpi"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenmpi-dev openmpi-bin \
	    >/dev/null 2>&1 || { DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenmpi-dev openmpi-bin; }; \
	else \
	  echo "make: MPI not found: libsdpa_mpi is skipped (apt-get install libopenmpi-dev openmpi-bin)"; \
	fi

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

test: test-release test-amx-emulated test-asan test-tsan

test-release: build
	cd $(BUILD) && ctest $(CTEST_FLAGS) -j $(JOBS)

# The AMX table's logic on CPUs without AMX: built with its tile instructions done in C
# (SDPA_AMX_EMULATE) and run through tests/test_mx.c, which says "skipped" where the CPU lacks
# AVX-512 too. (On a CPU with AMX, test-release runs the table itself.)
test-amx-emulated:
	cmake -S . -B $(EMU_BUILD) -DCMAKE_BUILD_TYPE=Release -DSDPA_AMX_EMULATE=ON \
	      -DSDPA_BUILD_CLI=OFF $(CMAKE_FLAGS)
	cmake --build $(EMU_BUILD) -j $(JOBS) --target test_mx
	cd $(EMU_BUILD) && ctest $(CTEST_FLAGS) -R '^test_mx$$'

test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DSDPA_SANITIZE=ON \
	      $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ctest $(CTEST_FLAGS) -j $(JOBS) -LE no-sanitizer

# The pool, determinism and thread tests under ThreadSanitizer (its own build: TSan cannot be
# combined with ASan).
test-tsan:
	bash tests/tsan/run_tsan.sh $(TSAN_BUILD)

# The unit suite under valgrind memcheck (tests/valgrind/run_memcheck.sh; AVX2 kernels).
memcheck: build
	bash tests/valgrind/run_memcheck.sh $(BUILD)

demo: build
	./$(BUILD)/cli/sdpa demo

bench: build
	./$(BUILD)/cli/sdpa bench --preset $(PRESET) $(BENCH_ARGS)

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# The fuzz targets (tests/fuzz/: the .npy header and load, and the API) under libFuzzer with
# ASan+UBSan, FUZZ_SECONDS each, built by CMake with SDPA_FUZZ in FUZZ_BUILD
# (tests/fuzz/run_fuzz.sh). New inputs go to $(FUZZ_BUILD)/corpus-*; the committed seeds in
# tests/fuzz/corpus/ are only read.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_BUILD   ?= build-fuzz
fuzz:
	for t in npy_header npy_load api; do \
	  FUZZ_CC=$(FUZZ_CC) JOBS=$(JOBS) bash tests/fuzz/run_fuzz.sh $$t $(FUZZ_SECONDS) \
	    $(FUZZ_BUILD) || exit 1; \
	done

format:
	clang-format -i $$(git ls-files -co --exclude-standard '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
