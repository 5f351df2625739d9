# bench-cluster: the cluster benchmark (bench/README.md, "The cluster benchmark"; issue 14 item 4): a
# fluxkv master and 3 owners on this machine (one with SSD), paths mixed / remote-memory / remote-ssd
# (+ its local-ssd reference), every hit attributed per response (memory or SSD, this owner or another),
# beside the tcp-raw limit (bench/remoteget -tcp-pair -child-pair, same bytes, same run) and Mooncake's
# dedicated_owner topology where it is installed. Writes $(BENCH_OUT)/summary.jsonl, goals.json and
# cluster.png; the quick preset (default) takes under 4 minutes on 2 cores. BENCH_PRESET=full: the
# seed's sizes per owner (hours); anything else through BENCH_ARGS, e.g.
#   make bench-cluster BENCH_OUT=out/bc BENCH_ARGS='--payloads 1MiB-128,4MiB-128 --workers c2,c4'
# Included by the top-level Makefile (which defines build, BIN, GO, PY).
GO ?= go
PY ?= /usr/bin/python3
REMOTEGET_BIN := bin/fluxkv-remoteget
BENCH_PRESET ?= quick
# BENCH_OUT as given on the command line (or in the environment); the top-level default (out/bench)
# belongs to the pressure benchmark, whose summary.jsonl this must not overwrite.
BENCH_CLUSTER_OUT = $(if $(filter command line environment environment override override,$(origin BENCH_OUT)),$(BENCH_OUT),out/bench-cluster)
APT_CLUSTER := python3-thrift python3-matplotlib

.PHONY: bench-cluster remoteget-bin

remoteget-bin:
	$(GO) build -o $(REMOTEGET_BIN) ./bench/remoteget

bench-cluster: build remoteget-bin
	@bash scripts/apt-ensure.sh $(APT_CLUSTER)
	PYTHONPATH=$(CURDIR)/bench $(PY) -m pressure cluster --preset $(BENCH_PRESET) --out $(BENCH_CLUSTER_OUT) \
	  --fluxkv-bin $(BIN) --remoteget-bin $(REMOTEGET_BIN) $(BENCH_ARGS)
