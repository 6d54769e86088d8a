# The one command runner for people and CI (`.ci/run` calls these targets).
#
#   make setup          install what tests and the demo need (idempotent; a no-op when done)
#   make test           setup + the whole test suite
#   make lint           rustfmt check + clippy with warnings as errors
#   make ci             lint + test, what CI runs
#   make demo           setup + the embedded showcase
#   make bench          criterion micro-benchmarks (classifier, framer)
#   make bench-pgbench  end-to-end direct vs PgBouncer vs pgfence (benches/pgbench_compare.sh)
#   make soak           the stale-writer workload with every fault for JEPSEN_SECS (default 1200)
#   make fuzz           every fuzz target in turn for FUZZ_SECS each (default 600)
#
# The tests start their own throwaway Postgres from the installed server binaries, so "setup" only
# has to make sure the binaries (and the client drivers some tests drive) are there.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

CARGO ?= cargo
PYTHON ?= python3
PG_MAJOR ?= 15
# Extra arguments for `cargo test`, e.g. `make test TEST_ARGS='-- harness'`.
TEST_ARGS ?=

# Root (CI, this machine) installs system packages directly; anyone else through sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_INSTALL := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends
# A fresh machine has no package lists; `apt-get update` is slow, so it runs only right before an
# install that is actually needed.
apt_update = $(SUDO) apt-get update -q

DRIVERS := tests/drivers

.PHONY: help setup setup-postgres setup-python setup-node setup-java build test demo fmt fmt-check clippy lint ci \
        bench-setup bench bench-pgbench soak fuzz clean

help:
	@sed -n '3,12p' Makefile | sed 's/^# \{0,1\}//'

## setup ---------------------------------------------------------------------------------------

setup: setup-postgres setup-python setup-node setup-java

# Server binaries for the throwaway clusters, psql/pgbench, and the `postgres` user they run as
# when we are root.
setup-postgres:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && command -v psql >/dev/null; then \
	  echo "postgres: $$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"; \
	else \
	  $(apt_update); $(APT_INSTALL) postgresql-$(PG_MAJOR) postgresql-client-$(PG_MAJOR); \
	fi
	@id -u postgres >/dev/null 2>&1 || $(SUDO) useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres

setup-python:
	@if $(PYTHON) -c 'import psycopg, asyncpg' 2>/dev/null; then \
	  echo "python drivers: present"; \
	else \
	  $(PYTHON) -m pip install -q --disable-pip-version-check --root-user-action=ignore -r $(DRIVERS)/requirements.txt; \
	fi

# `npm ci` installs exactly the committed lock file; the stamp npm writes makes a re-run free.
setup-node: $(DRIVERS)/node_modules/.package-lock.json
$(DRIVERS)/node_modules/.package-lock.json: $(DRIVERS)/package.json $(DRIVERS)/package-lock.json
	cd $(DRIVERS) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# pgjdbc from Debian's package (Maven Central is not reachable from CI); the JDK is on the
# machine image, else Debian's default one (a JRE alone cannot run a single-file program).
JDBC_JAR := /usr/share/java/postgresql.jar
setup-java:
	@if command -v javac >/dev/null && [ -f $(JDBC_JAR) ]; then \
	  echo "jdbc: $(JDBC_JAR)"; \
	else \
	  $(apt_update); $(APT_INSTALL) libpostgresql-jdbc-java $$(command -v javac >/dev/null || echo default-jdk-headless); \
	fi

## build, test, lint -----------------------------------------------------------------------------

build:
	$(CARGO) build --locked

test: setup
	$(CARGO) test --locked $(TEST_ARGS)

demo: setup
	$(CARGO) run --release --locked -- demo

fmt:
	$(CARGO) fmt --all

lint: fmt-check clippy

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --all-targets --locked -- -D warnings

ci: lint test

## benchmarks ------------------------------------------------------------------------------------

bench-setup: setup-postgres
	@command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || { $(apt_update); $(APT_INSTALL) pgbouncer; }

bench:
	$(CARGO) bench --locked

# Always rebuild: the script would otherwise measure whatever release binary is lying around.
bench-pgbench: bench-setup
	$(CARGO) build --release --locked
	bash benches/pgbench_compare.sh

## proving it (docs/TESTING.md) --------------------------------------------------------------------

JEPSEN_SECS ?= 1200
FUZZ_SECS ?= 600
FUZZ_TARGETS := frame startup analyze split_declare rewrite

soak: setup-postgres
	JEPSEN_SECS=$(JEPSEN_SECS) $(CARGO) test --release --locked --test it jepsen -- --nocapture

# One target at a time (fuzzing takes every core it gets). New inputs go to fuzz/work/, so the
# committed seeds in fuzz/corpus/ stay small. Stable Rust: cargo-fuzz needs RUSTC_BOOTSTRAP.
fuzz:
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	cd fuzz && for t in $(FUZZ_TARGETS); do \
	  mkdir -p work/$$t && \
	  RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run -s none $$t work/$$t corpus/$$t -- -max_total_time=$(FUZZ_SECS) -timeout=5; \
	done

clean:
	$(CARGO) clean
	rm -rf $(DRIVERS)/node_modules
