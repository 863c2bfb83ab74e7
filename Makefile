# tvcert: two commands matter — `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

.PHONY: hostile demo test proofs coq browser sysdeps venv bench fuzz conform clean

# torchtitan's declared deps (datasets, wandb, tensorboard, torchdata, ...: ~40 packages) serve its
# trainer; tests/test_trace_torchtitan.py imports only the models: --no-deps, plus what they import.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test]'
	$(PIP) install -q --no-deps torchtitan==0.3.0
	$(PIP) install -q spmd_types==0.2.3 tyro==1.0.17
	touch $(STAMP)

venv: $(STAMP)

# Coq 8.16 + MathComp from Debian when coqc is missing (CI machines start without it).
coq:
	@command -v coqc >/dev/null 2>&1 || { \
	  echo "installing Coq from Debian (apt-get install -y coq)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq coq libcoq-mathcomp-ssreflect libcoq-mathcomp-algebra >/dev/null; }

# Graphviz (the report's drawings) and headless Chromium (tests/test_report_browser.py) from Debian when missing.
browser:
	@{ command -v dot >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1; } || { \
	  echo "installing Graphviz and Chromium from Debian (apt-get install -y graphviz chromium)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq graphviz chromium >/dev/null; }

## The main job on a bundled example: verify the Megatron TP MLP and write its certificate.
demo: $(STAMP)
	$(VENV)/bin/tvcert verify examples/mlp_tp2.json --emit-cert build/mlp_tp2.cert.json; \
	  rc=$$?; [ $$rc -le 2 ] || exit $$rc
	$(VENV)/bin/tvcert check build/mlp_tp2.cert.json --plan examples/mlp_tp2.json
	$(VENV)/bin/tvcert verify -q examples/mlp_tp2_no_allreduce.json --report build/mlp_tp2_no_allreduce.html \
	  >/dev/null; rc=$$?; [ $$rc -le 2 ] || exit $$rc
	@echo "example report (a refutation: the missing all_reduce): open build/mlp_tp2_no_allreduce.html in a browser"

# What make test needs from Debian, in one apt-get call (a fresh CI machine has none of it: one index update, not two).
sysdeps:
	@pkgs=""; \
	  command -v coqc >/dev/null 2>&1 || pkgs="$$pkgs coq libcoq-mathcomp-ssreflect libcoq-mathcomp-algebra"; \
	  command -v dot >/dev/null 2>&1 || pkgs="$$pkgs graphviz"; \
	  command -v chromium >/dev/null 2>&1 || pkgs="$$pkgs chromium"; \
	  [ -z "$$pkgs" ] || { \
	    echo "installing from Debian (apt-get install -y$$pkgs)"; \
	    SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    $$SUDO apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$pkgs >/dev/null; }

## Everything: install what is needed, recheck the proofs, run the test suite (TEST_JOBS pytest-xdist workers, one
## test file per worker so a file's module fixtures are built once).
TEST_JOBS ?= 2
test: $(STAMP) sysdeps
	$(PY) -m tvcert.proofkit check --coqchk
	$(PY) -m pytest tests -n $(TEST_JOBS) --dist loadfile

proofs: $(STAMP) coq
	$(VENV)/bin/tvcert proofs

bench: $(STAMP)
	$(PY) bench/run.py

N ?= 100000
fuzz: $(STAMP)
	$(PY) -m tvcert.fuzz --pairs $(N)

## Hostile-input suite (issue 18): N generated bad inputs (default 10000), each in a forked child; exit 1 on a
## traceback, hang (30 s), 1 GB peak, wrong exit code or a bad message (bench/fuzz_results.md records a run)
hostile: $(STAMP)
	$(PY) -m tvcert.fuzz.hostile --n $(if $(filter command line,$(origin N)),$(N),10000)

## Rule conformance: N random instances per kernel rule id (default 1000), checked on every rank against the
## reference interpreter (tvcert.conform; bench/conformance_results.md records a run)
conform: $(STAMP)
	$(PY) -m tvcert.conform --n $(if $(filter command line,$(origin N)),$(N),1000)

clean:
	rm -rf build $(VENV) Rules/*.vo Rules/*.glob
