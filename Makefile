# fluxkv — see README.md. `make run` starts a single-node cache and shows it working;
# `make test` runs every test (installing the Debian packages the tests need).
SHELL := /bin/bash
GO ?= go
PY ?= /usr/bin/python3
BIN := bin/fluxkv
# RACE_BIN is the same binary built with -race: the functional process tests run it, so
# the owner's and master's concurrency is race-checked too.
RACE_BIN := bin/fluxkv-race
APT_TEST := python3-thrift python3-numpy python3-pytest python3-matplotlib memcached redis-server python3-pymemcache python3-redis etcd-server etcd-client
# python3-torch: the KV page tests (fluxkv.kv on real tensors), installed without recommends.
APT_TORCH := python3-torch
APT_GEN := thrift-compiler
# Packages whose tests exercise concurrency run under the race detector.
RACE_PKGS := ./master/... ./daemon/... ./shm/... ./ssd/... ./clients/go/... ./cmd/... ./metrics/... ./protocol/... ./internal/rawsock/...
# Tests that start fluxkv processes: FLUXKV_BIN is the -race build (functional tests),
# FLUXKV_BIN_NORACE the plain one (limits, soak, benchmarks). A -race child stops at its
# first race with exit status 66, which fails the test that started it. The packages
# tested without -race (bench/soak, config, deploy, internal but rawsock) get the plain binary as both.
# atexit_sleep_ms=0: a -race process (test binary or child) exits at once instead of
# sleeping the race runtime's default second first; halt_on_error already ends one at
# its first report, and a second per process was minutes of `make test`.
TEST_ENV = FLUXKV_BIN=$(CURDIR)/$(RACE_BIN) FLUXKV_BIN_NORACE=$(CURDIR)/$(BIN) GORACE="halt_on_error=1 exitcode=66 atexit_sleep_ms=0"
FUZZTIME ?= 10s

.PHONY: all build build-race run serve test test-go test-python vet fuzz gen deps-test deps-gen clean bench-ssd bench-python bench-kv bench-trace bench bench-quick install

all: build

build:
	$(GO) build -buildvcs=auto -o $(BIN) ./cmd/fluxkv

build-race:
	$(GO) build -buildvcs=auto -race -o $(RACE_BIN) ./cmd/fluxkv

run: build
	bash scripts/demo.sh

# serve: a node in the foreground until Ctrl-C.
serve: build
	./$(BIN) --log-format text up --dir $${DIR:-out/node} --dram $${DRAM:-1GiB}

# deps-*: install missing Debian packages (CI and fresh machines run as root).
deps-test:
	@bash scripts/apt-ensure.sh $(APT_TEST)
	@NO_RECOMMENDS=1 bash scripts/apt-ensure.sh $(APT_TORCH)

deps-gen:
	@bash scripts/apt-ensure.sh $(APT_GEN)

vet:
	$(GO) vet ./...

test: deps-test vet build build-race test-go test-python test-cpp
	$(MAKE) soak SOAK=60s

# -parallel 4: the daemon package's process tests marked t.Parallel mostly wait on
# heartbeats, leases and failovers, so four of them share the two cores (the default is
# GOMAXPROCS); no other package of RACE_PKGS calls t.Parallel.
test-go: build build-race
	$(TEST_ENV) $(GO) test -race -timeout 20m -parallel 4 $(RACE_PKGS)
	FLUXKV_BIN=$(CURDIR)/$(BIN) FLUXKV_BIN_NORACE=$(CURDIR)/$(BIN) \
	  $(GO) test -timeout 10m $$($(GO) list ./... | grep -v -e /master -e /daemon -e /shm -e /ssd -e /clients/go -e /cmd/ -e /metrics -e /protocol/ -e /internal/rawsock)

# test-python: the Python client against real (-race) daemons; the layers above the client
# (fluxkv.kv and the engine backends: KV pages of real models, many MiB each) against the
# plain binary, whose concurrency the client tests and the Go tests race-check; and the
# pressure harness's own tests (a benchmark: the plain binary).
KV_TESTS := tests/test_kv.py tests/test_kv_model.py tests/test_sglang_backend.py tests/test_lmcache_backend.py tests/test_lmcache_releases.py
test-python: build build-race
	cd clients/python && $(TEST_ENV) $(PY) -m pytest -q tests $(addprefix --ignore=,$(KV_TESTS))
	cd clients/python && FLUXKV_BIN=$(CURDIR)/$(BIN) FLUXKV_BIN_NORACE=$(CURDIR)/$(BIN) $(PY) -m pytest -q $(KV_TESTS)
	cd bench && FLUXKV_BIN=$(CURDIR)/$(BIN) FLUXKV_BIN_NORACE=$(CURDIR)/$(BIN) $(PY) -m pytest -q pressure/tests tracebench/tests

# fuzz: run every fuzz target briefly (FUZZTIME each).
fuzz: build
	$(GO) test ./master/ -run '^$$' -fuzz '^FuzzAllocator$$' -fuzztime $(FUZZTIME)
	$(GO) test ./master/ -run '^$$' -fuzz '^FuzzPolicy$$' -fuzztime $(FUZZTIME)
	$(GO) test ./master/ -run '^$$' -fuzz '^FuzzPagePolicy$$' -fuzztime $(FUZZTIME)
	$(GO) test ./master/ -run '^$$' -fuzz '^FuzzRangeSet$$' -fuzztime $(FUZZTIME)
	$(GO) test ./master/ -run '^$$' -fuzz '^FuzzStateRandom$$' -fuzztime $(FUZZTIME)
	$(GO) test ./master/ -run '^$$' -fuzz '^FuzzMasterFrames$$' -fuzztime $(FUZZTIME)
	$(GO) test ./master/ha/ -run '^$$' -fuzz '^FuzzParseURL$$' -fuzztime $(FUZZTIME)
	$(GO) test ./shm/ -run '^$$' -fuzz '^FuzzReadFrame$$' -fuzztime $(FUZZTIME)
	$(GO) test ./ssd/ -run '^$$' -fuzz '^FuzzRing$$' -fuzztime $(FUZZTIME)
	$(GO) test ./ssd/ -run '^$$' -fuzz '^FuzzRecordHeader$$' -fuzztime $(FUZZTIME)
	FLUXKV_BIN=$(CURDIR)/$(BIN) $(GO) test ./daemon/ -run '^$$' -fuzz '^FuzzExternalDispatch$$' -fuzztime $(FUZZTIME)
	FLUXKV_BIN=$(CURDIR)/$(BIN) $(GO) test ./daemon/ -run '^$$' -fuzz '^FuzzReplicaIndex$$' -fuzztime $(FUZZTIME)
	FLUXKV_BIN=$(CURDIR)/$(BIN) $(GO) test ./daemon/ -run '^$$' -fuzz '^FuzzPeerFrames$$' -fuzztime $(FUZZTIME)
	$(GO) test ./protocol/wire/ -run '^$$' -fuzz '^FuzzCheckMessage$$' -fuzztime $(FUZZTIME)
	$(GO) test ./daemon/transfer/ -run '^$$' -fuzz '^FuzzParseRequest$$' -fuzztime $(FUZZTIME)
	$(GO) test ./daemon/transfer/ -run '^$$' -fuzz '^FuzzReplyStream$$' -fuzztime $(FUZZTIME)
	$(GO) test ./protocol/auth/ -run '^$$' -fuzz '^FuzzServerHandshake$$' -fuzztime $(FUZZTIME)

# gen: regenerate the committed Kitex (Go) and thrift (Python) code from protocol/*.thrift.
gen: deps-gen
	for f in external master peer; do \
	  $(GO) tool kitex -module github.com/fluxkv/fluxkv -gen-path protocol/kitex_gen protocol/$$f.thrift || exit 1; \
	done
	bash scripts/gen-python.sh

# install: binary to $(PREFIX)/bin (default /usr/local), systemd units to
# $(DESTDIR)/lib/systemd/system, example configs to $(DESTDIR)/etc/fluxkv (existing
# ones kept); as root without DESTDIR it also creates the fluxkv user and group.
install: build
	PREFIX='$(PREFIX)' DESTDIR='$(DESTDIR)' BIN='$(BIN)' bash scripts/install.sh

APT_BENCH := memcached redis-server python3-pymemcache python3-redis

# bench-python: 1 MiB memory-hit gets from Python: fluxkv holder/bytes vs memcached and Redis; then
# one thread over a working set in DRAM (4 KiB / 64 KiB / 1 MiB, Zipf and uniform; Go at 4 KiB):
# the per-get cost of a node (WORKING_SET keys, default 4096); then the batch calls (bench/batch_bench.py).
WORKING_SET ?= 4096
bench-python: build deps-test
	@bash scripts/apt-ensure.sh $(APT_BENCH)
	$(PY) bench/python_get_bench.py --fluxkv-bin $(BIN) --seconds 5 --keys 16
	$(PY) bench/working_set_bench.py --fluxkv-bin $(BIN) --working-set $(WORKING_SET) --seconds 3
	$(PY) bench/batch_bench.py --fluxkv-bin $(BIN)

# bench-kv: KV pages through fluxkv.kv (bench/kv_bench.py): time to first token of the test model
# (clients/python/tests/tinylm.py, d_model 512 x 4 layers) for a 4096-token prompt with 0/50/90 % of
# its pages cached vs recompute, and put_pages/get_pages_into GiB/s vs memcpy (64 x 256 KiB pages);
# more flags (sizes, --json FILE): KV_BENCH_ARGS.
bench-kv: build
	@bash scripts/apt-ensure.sh python3-thrift python3-numpy
	@NO_RECOMMENDS=1 bash scripts/apt-ensure.sh $(APT_TORCH)
	$(PY) bench/kv_bench.py --fluxkv-bin $(BIN) $(KV_BENCH_ARGS)

# bench-trace: a real LLM request trace (bench/traces/conversation_trace.jsonl, Mooncake's FAST'25
# conversation trace) replayed through fluxkv.kv as a serving engine would (prefix lookup, load, store),
# beside Redis, memcached (extstore with SSD), Mooncake Store where installed, and offline LRU, S3-FIFO,
# Belady and the infinite cache on the same requests (bench/README.md). BENCH_PRESET=quick (64 KiB
# blocks, the first 3,000 requests, minutes) or full (28 MiB blocks: Qwen2.5-7B; hours, hundreds of GiB);
# BENCH_OUT (default out/bench-trace) gets summary.jsonl and trace.png; more flags: BENCH_ARGS.
BENCH_PRESET ?= quick
BENCH_TRACE_OUT = $(if $(filter command line environment environment override override,$(origin BENCH_OUT)),$(BENCH_OUT),out/bench-trace)
APT_TRACE := memcached redis-server python3-pymemcache python3-redis python3-hiredis python3-thrift python3-numpy python3-matplotlib
bench-trace: build
	@bash scripts/apt-ensure.sh $(APT_TRACE)
	PYTHONPATH=$(CURDIR)/bench $(PY) -m tracebench --preset $(BENCH_PRESET) --out $(BENCH_TRACE_OUT) --fluxkv-bin $(BIN) $(BENCH_ARGS)

bench-ssd: build
	./$(BIN) bench ssd --dir $${DIR:-out/bench-ssd} --size 1MiB --seconds 10 --json

# bench / bench-quick: the pressure benchmark (bench/README.md): fluxkv vs memcached (extstore) vs
# Redis, SSD off/on, Zipf 0.99; writes $(BENCH_OUT)/summary.jsonl and pressure.png. bench is the
# seed's full matrix (2 GiB DRAM, 2.5 GiB dataset, 16 GiB SSD, 30 s windows: hours on a small box);
# sizes: BENCH_DRAM, BENCH_SSD, BENCH_DATASET, BENCH_WARMUP, BENCH_WINDOW; anything else: BENCH_ARGS.
BENCH_OUT ?= out/bench
APT_PRESSURE := memcached redis-server python3-pymemcache python3-redis python3-hiredis python3-thrift python3-matplotlib
BENCH_FLAGS = $(if $(BENCH_DRAM),--dram $(BENCH_DRAM)) $(if $(BENCH_SSD),--ssd-size $(BENCH_SSD)) \
	$(if $(BENCH_DATASET),--dataset $(BENCH_DATASET)) $(if $(BENCH_WARMUP),--warmup $(BENCH_WARMUP)) \
	$(if $(BENCH_WINDOW),--window $(BENCH_WINDOW)) $(BENCH_ARGS)

bench: build
	@bash scripts/apt-ensure.sh $(APT_PRESSURE)
	PYTHONPATH=$(CURDIR)/bench $(PY) -m pressure run --preset full --out $(BENCH_OUT) --fluxkv-bin $(BIN) $(BENCH_FLAGS)

bench-quick: build
	@bash scripts/apt-ensure.sh $(APT_PRESSURE)
	PYTHONPATH=$(CURDIR)/bench $(PY) -m pressure run --preset quick --out $(BENCH_OUT) --fluxkv-bin $(BIN) $(BENCH_FLAGS)

clean:
	rm -rf bin out clients/cpp/build clients/cpp/build-asan

# soak / chaos: the verified, hostile workload of bench/soak (README there) against real master
# and owner processes with SSD on and 4x less DRAM than the data; Go and Python clients killed
# with -9 at random; chaos also kills and restarts the owner and the master. SOAK: duration
# (default 10m; `make test` runs 60s); SOAK_ARGS: more flags (sizes, workers, -keep).
SOAK ?= 10m
SOAK_BIN := bin/fluxkv-soak
.PHONY: soak chaos soak-bin
soak-bin:
	@bash scripts/apt-ensure.sh python3-numpy python3-thrift
	$(GO) build -o $(SOAK_BIN) ./bench/soak

soak: build soak-bin
	FLUXKV_BIN=$(CURDIR)/$(BIN) ./$(SOAK_BIN) -duration $(SOAK) -python $(PY) -py-worker bench/soak/worker.py -py-path clients/python $(SOAK_ARGS)

chaos: build soak-bin
	FLUXKV_BIN=$(CURDIR)/$(BIN) ./$(SOAK_BIN) -chaos -duration $(SOAK) -python $(PY) -py-worker bench/soak/worker.py -py-path clients/python $(SOAK_ARGS)

# image: the container image of deploy/Containerfile (docs/container-image.md), built with
# podman where installed, else docker (CONTAINER_BUILDER=... picks one), tagged
# $(IMAGE):$(VERSION) and $(IMAGE):latest. The build context has no .git, so the commit
# (-dirty for a modified tree, as the go tool says) and its date go in as build args,
# which the Containerfile links into the binary (-ldflags -X; `fluxkv version`).
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo unknown)
IMAGE ?= fluxkv
IMAGE_COMMIT = $(shell git rev-parse HEAD 2>/dev/null)$(if $(shell git status --porcelain 2>/dev/null | head -1),-dirty)
IMAGE_DATE = $(shell TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null)
CONTAINER_BUILDER ?= $(shell command -v podman 2>/dev/null || command -v docker 2>/dev/null)
.PHONY: image
image:
	@if [ -z '$(CONTAINER_BUILDER)' ]; then \
	  echo 'make image: neither podman nor docker is installed; install one, or set CONTAINER_BUILDER=/path/to/builder' >&2; exit 1; fi
	$(CONTAINER_BUILDER) build -f deploy/Containerfile \
	  --build-arg VERSION='$(VERSION)' --build-arg COMMIT='$(IMAGE_COMMIT)' --build-arg DATE='$(IMAGE_DATE)' \
	  -t '$(IMAGE):$(VERSION)' -t '$(IMAGE):latest' .

# bench-cluster: the cluster benchmark (bench/cluster.mk, bench/README.md).
include bench/cluster.mk
# cpp, install-cpp, test-cpp, bench-cpp: the C++ client and C ABI (clients/cpp/README.md).
include clients/cpp/cpp.mk
