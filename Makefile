# The two commands a newcomer runs (see README): `make demo` and `make test`.
PYTHON ?= python3
PIP = $(PYTHON) -m pip install --quiet --disable-pip-version-check
PYTEST_WORKERS ?= 2

.PHONY: install install-test demo test lint docs hpm fuzz

install:
	$(PIP) -e .

# Everything the tests need: dev extras, the local CPU torch (test-only, for ONNX export),
# Icarus Verilog (RTL co-simulation) and Graphviz (DOT export checks).
APT_TOOLS = iverilog:iverilog dot:graphviz
# torch first: the local CPU wheel (2.13.0) must be in place before anything that depends on torch is resolved,
# or pip fetches a multi-gigabyte CUDA build. torchvision 0.28.0 is the release that pairs with it.
install-test:
	$(PIP) torch==2.13.0 torchvision==0.28.0
	$(PIP) -e '.[dev]'
	@missing=""; for pair in $(APT_TOOLS); do command -v $${pair%%:*} >/dev/null || missing="$$missing $${pair##*:}"; done; \
	if [ -n "$$missing" ]; then apt-get update -qq && apt-get install -y -qq $$missing; fi

# The main job: dynamic fusion of a PyTorch-exported transformer encoder layer, against the unfused and
# rule-based baselines, every number from the cycle-level simulator.
demo: install
	$(PYTHON) -m dynfuse fuse examples/models/encoder_post_d64.onnx --dtype int8 --compare none,static,dynamic --report

# pytest exits 5 when it collects nothing; that is not a failure of the suite.
test: install-test
	$(PYTHON) -m pytest -n $(PYTEST_WORKERS) -q; rc=$$?; [ $$rc -eq 5 ] && { echo "no tests collected"; exit 0; }; exit $$rc

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

# Everything derived from the ISA table: docs/isa.md and the Verilog headers in rtl/generated.
docs:
	$(PYTHON) -m isa.render
	$(PYTHON) -m rtl.generate

# The suite's fuzzers (tests/fuzz, a few seconds each) run for minutes before a release; their counts are
# appended to build/fuzz-report.md (docs/robustness.md records a run). FUZZ_SECONDS per fuzzer, FUZZ_SEED to vary.
FUZZ_SECONDS ?= 120
FUZZ_SEED ?= 1
fuzz:
	mkdir -p build && rm -f build/fuzz-report.md
	DYNFUSE_FUZZ_SECONDS=$(FUZZ_SECONDS) DYNFUSE_FUZZ_SEED=$(FUZZ_SEED) DYNFUSE_FUZZ_REPORT=$(CURDIR)/build/fuzz-report.md \
		$(PYTHON) -m pytest tests/fuzz -q -p no:cacheprovider
	cat build/fuzz-report.md

# The learned cost model shipped in the package (fusion/hpm/data/hpm.npz), recalibrated on the current kernel
# generators: a seeded sweep (its directory is named by the generators' stamp, so a rerun resumes it and a
# generator change starts afresh), the model fitted on its training split (seeded), and its held-out figures.
# HPM_RUNNER: how the sweep runs its groups (fusion/tasks: Ray when installed, else local processes; e.g.
# `HPM_RUNNER="--backend ray --address HOST:6379"` on a cluster). 2,812 groups (the shipped model's): ~11 min on
# 2 cores with a recipe per registered strategy, 33,207 kernels; results do not depend on the runner.
HPM_SAMPLES ?= 2812
HPM_RUNNER ?= --workers 2
HPM_DATA ?= build/hpm
hpm:
	stamp=$$($(PYTHON) -m fusion.hpm.stamp) && \
	$(PYTHON) -m dynfuse hpm calibrate --configs base,tiny --samples $(HPM_SAMPLES) --seed 0 $(HPM_RUNNER) \
		--no-progress -o $(HPM_DATA)/$$stamp && \
	$(PYTHON) -m dynfuse hpm train $(HPM_DATA)/$$stamp --seed 0 -o fusion/hpm/data/hpm.npz && \
	$(PYTHON) -m dynfuse hpm eval $(HPM_DATA)/$$stamp --model fusion/hpm/data/hpm.npz
