# The C++ client and C ABI (clients/cpp): included by the top-level Makefile.
#
#   make cpp          libfluxkv.so / libfluxkv.a, the C example, tests and benchmark in clients/cpp/build
#   make install-cpp  headers, libraries and fluxkv.pc under $(PREFIX) (default /usr/local); DESTDIR honoured
#   make test-cpp     the tests, plain and under ASan/UBSan (clients/cpp/build-asan), against real owners
#   make bench-cpp    1 MiB memory-hit gets: C++ holder/copy beside the Go client and Python
#
# Only these targets need a C++ toolchain: cmake and g++ are installed on first use.

# Keep the including Makefile's default goal (this file may be included before its first rule).
CPP_SAVED_DEFAULT_GOAL := $(.DEFAULT_GOAL)

CPP_DIR := clients/cpp
CPP_BUILD := $(CPP_DIR)/build
CPP_ASAN_BUILD := $(CPP_DIR)/build-asan
CPP_APT := cmake g++ make
CPP_JOBS ?= 2
# Install prefix: $(PREFIX) as for `make install`, default /usr/local (not set globally here).
CPP_PREFIX = $(if $(PREFIX),$(PREFIX),/usr/local)
# Unity builds (8 sources per compiler run) halve the build time on two cores.
CPP_UNITY := -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=8

.PHONY: cpp cpp-deps cpp-asan install-cpp test-cpp bench-cpp

cpp-deps:
	@bash scripts/apt-ensure.sh $(CPP_APT)

cpp: cpp-deps
	cmake -S $(CPP_DIR) -B $(CPP_BUILD) $(CPP_UNITY) -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX='$(CPP_PREFIX)' >/dev/null
	cmake --build $(CPP_BUILD) -j $(CPP_JOBS)

# The same library and tests with AddressSanitizer and UndefinedBehaviorSanitizer, unoptimized
# (-O0 -g1): the shortest build on a small machine, with readable reports.
cpp-asan: cpp-deps
	cmake -S $(CPP_DIR) -B $(CPP_ASAN_BUILD) $(CPP_UNITY) -DCMAKE_BUILD_TYPE=Debug -DFLUXKV_SANITIZE=ON \
	  -DCMAKE_CXX_FLAGS_DEBUG="-O0 -g1" -DCMAKE_C_FLAGS_DEBUG="-O0 -g1" >/dev/null
	cmake --build $(CPP_ASAN_BUILD) -j $(CPP_JOBS) --target fluxkv_tests fluxkv_example

# fluxkv.pc names the prefix, so `cpp` configures the build with it.
install-cpp: cpp
	DESTDIR='$(DESTDIR)' cmake --install $(CPP_BUILD)

test-cpp: build cpp cpp-asan
	$(CPP_DIR)/tests/run.sh $(CURDIR)/$(BIN) $(CPP_BUILD) $(CPP_ASAN_BUILD)

bench-cpp: build cpp
	@bash scripts/apt-ensure.sh python3-thrift python3-numpy
	$(PY) bench/cpp_get_bench.py --fluxkv-bin $(BIN) --cpp-bench $(CPP_BUILD)/fluxkv_get_bench --seconds 5 --keys 16

.DEFAULT_GOAL := $(CPP_SAVED_DEFAULT_GOAL)
