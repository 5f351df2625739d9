# fluxkv — see README.md. `make run` starts a single-node cache and shows it working;
# `make test` runs every test (installing the Debian packages the tests need).
SHELL := /bin/bash
GO ?= go
PY ?= /usr/bin/python3
BIN := bin/fluxkv
APT_TEST := python3-thrift python3-numpy python3-pytest
APT_GEN := thrift-compiler
# Packages whose tests exercise concurrency run under the race detector.
RACE_PKGS := ./master/... ./daemon/... ./shm/... ./ssd/... ./clients/go/...
FUZZTIME ?= 10s

.PHONY: all build run serve test test-go test-python vet fuzz gen deps-test deps-gen clean bench-ssd bench-python install

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

test-python: build
	@if [ -d clients/python/tests ]; then \
	  cd clients/python && FLUXKV_BIN=$(CURDIR)/$(BIN) $(PY) -m pytest -q tests; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc; \
	fi

# fuzz: run every fuzz target briefly (FUZZTIME each).
fuzz:
	$(GO) test ./master/ -run '^$$' -fuzz '^FuzzAllocator$$' -fuzztime $(FUZZTIME)
	$(GO) test ./master/ -run '^$$' -fuzz '^FuzzPolicy$$' -fuzztime $(FUZZTIME)
	$(GO) test ./shm/ -run '^$$' -fuzz '^FuzzReadFrame$$' -fuzztime $(FUZZTIME)
	$(GO) test ./ssd/ -run '^$$' -fuzz '^FuzzRing$$' -fuzztime $(FUZZTIME)

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

clean:
	rm -rf bin out
