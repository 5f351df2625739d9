# fluxkv — see README.md. `make run` starts a single-node cache and shows it working;
# `make test` runs every test (installing the Debian packages the tests need).
SHELL := /bin/bash
GO ?= go
PY ?= /usr/bin/python3
BIN := bin/fluxkv
APT_TEST := python3-thrift python3-numpy python3-pytest python3-matplotlib memcached redis-server python3-pymemcache python3-redis
APT_GEN := thrift-compiler
# Packages whose tests exercise concurrency run under the race detector.
RACE_PKGS := ./master/... ./daemon/... ./shm/... ./ssd/... ./clients/go/...
FUZZTIME ?= 10s

.PHONY: all build run serve test test-go test-python vet fuzz gen deps-test deps-gen clean bench-ssd bench-python bench bench-quick install

all: build

build:
	$(GO) build -o $(BIN) ./cmd/fluxkv

run: build
	bash scripts/demo.sh

# serve: a node in the foreground until Ctrl-C.
serve: build
	./$(BIN) --log-format text up --dir $${DIR:-out/node} --dram $${DRAM:-1GiB}

# deps-*: install missing Debian packages (CI and fresh machines run as root).
deps-test:
	@bash scripts/apt-ensure.sh $(APT_TEST)

deps-gen:
	@bash scripts/apt-ensure.sh $(APT_GEN)

vet:
	$(GO) vet ./...

test: deps-test vet build test-go test-python

test-go:
	FLUXKV_BIN=$(CURDIR)/$(BIN) $(GO) test -race -timeout 20m $(RACE_PKGS)
	$(GO) test -timeout 10m $$($(GO) list ./... | grep -v -e /master -e /daemon -e /shm -e /ssd -e /clients/go)

# test-python: the Python client against real daemons, and the pressure harness's own tests.
test-python: build
	cd clients/python && FLUXKV_BIN=$(CURDIR)/$(BIN) $(PY) -m pytest -q tests
	cd bench && FLUXKV_BIN=$(CURDIR)/$(BIN) $(PY) -m pytest -q pressure/tests

# fuzz: run every fuzz target briefly (FUZZTIME each).
fuzz:
	$(GO) test ./master/ -run '^$$' -fuzz '^FuzzAllocator$$' -fuzztime $(FUZZTIME)
	$(GO) test ./master/ -run '^$$' -fuzz '^FuzzPolicy$$' -fuzztime $(FUZZTIME)
	$(GO) test ./shm/ -run '^$$' -fuzz '^FuzzReadFrame$$' -fuzztime $(FUZZTIME)
	$(GO) test ./ssd/ -run '^$$' -fuzz '^FuzzRing$$' -fuzztime $(FUZZTIME)
	$(GO) test ./daemon/ -run '^$$' -fuzz '^FuzzExternalDispatch$$' -fuzztime $(FUZZTIME)

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

# bench-python: 1 MiB memory-hit gets from Python: fluxkv holder/bytes vs memcached and Redis.
bench-python: build deps-test
	@bash scripts/apt-ensure.sh $(APT_BENCH)
	$(PY) bench/python_get_bench.py --fluxkv-bin $(BIN) --seconds 5 --keys 16

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
	rm -rf bin out
