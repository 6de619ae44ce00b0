# Two entry points: `make test` (everything CI runs) and `make demo` (the narrated scenario on a
# local control plane). Both set themselves up from nothing: venv, package, control plane build.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test check test-fast test-planes-down demo demo-notice install control-plane helm manifests lint unit integration world explore bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# PYTHONWARNINGS: setuptools prints a boxed "editable installation" notice for every editable
# install (a UserWarning in the build backend); it is noise to a newcomer, not a problem.
# The runtime (with its test tools) and the dev tools (devtools/: the local control plane, the
# demo and the pytest fixtures, a distribution of their own so that the runtime ships none of it).
$(STAMP): $(BIN)/python pyproject.toml devtools/pyproject.toml examples/ungater-leaderworkerset/pyproject.toml
	PYTHONWARNINGS=ignore::UserWarning $(BIN)/pip install -q -e '.[test]' -e devtools --group lint
	PYTHONWARNINGS=ignore::UserWarning $(BIN)/pip install -q -e examples/ungater-leaderworkerset
	touch $(STAMP)

install: $(STAMP)

control-plane: $(STAMP)
	$(BIN)/python -m ungater_devtools.devcluster build

# helm (for the chart tests) is built from Go modules too, cached like the control plane.
helm: $(STAMP)
	$(BIN)/python -m ungater_devtools.devcluster.helm build

manifests: helm
	$(BIN)/python -m ungater_devtools.devcluster.helm render-manifests

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit examples/ungater-leaderworkerset/tests -q

# The randomized whole-controller world (tests/unit/controller/test_controller_properties.py)
# over many seeds, on its virtual clock: make world SEEDS=200 (under 1 s a seed on two cores).
# `make test` runs its first 40. PYTHONHASHSEED fixed: a failing seed replays the same run.
SEEDS ?= 200
world: $(STAMP)
	WORLD_SEEDS=$(SEEDS) PYTHONHASHSEED=0 $(BIN)/python -m pytest tests/unit/controller/test_controller_properties.py -q

# The small-scope explorer (tests/explore/, docs/testing.md): every interleaving of each
# scenario's choice points, for every built-in kind, up to DEPTH actions, deeper than `make
# test` goes (its depths are in tests/explore/test_explore.py). It prints the states explored
# per scenario and kind, or the shortest breaking path. EXPLORE_ARGS: more options, e.g.
# `--kind RayJob --scenario resize-no-delete` or `--against fe342f5` (another commit's
# controller, from a temporary worktree).
DEPTH ?= 6
EXPLORE_ARGS ?=
explore: $(STAMP)
	$(BIN)/python -m tests.explore --depth $(DEPTH) $(EXPLORE_ARGS)

# pytest-xdist workers: each starts its own planes (a plain one, and a Kueue one per version
# its tests ask for); the tests of one Kueue version other than the default share one worker
# (`--dist loadgroup`, tests/integration/conftest.py). Four, measured on two cores: most of an
# integration test is waiting on real controllers (docs/testing.md, "Where the time goes").
WORKERS ?= 4
XDIST := -n $(WORKERS) --dist loadgroup

integration: control-plane helm
	$(BIN)/python -m pytest tests/integration -q $(XDIST)

test: control-plane helm lint
	$(BIN)/python -m pytest tests examples/ungater-leaderworkerset/tests -q $(XDIST)

# The inner loop on the integration tests: the planes they attach to ($UNGATER_TEST_PLANES,
# docs/testing.md) run detached under PLANES and outlive the run, so their start-ups (a plain
# plane ~10 s, a Kueue one ~35 s on two cores) are paid once, not at every run; `dev-cluster up`
# finds a running one and starts nothing. make test-fast TESTS=tests/integration/test_real_jobs.py
# for a subset; make test-planes-down stops them. Serial, unlike `make integration`: every
# pytest-xdist worker would attach to the same three planes, where concurrent tests are not
# isolated from each other's cluster-wide controllers (Kueue, the Job controller, JobSet,
# KubeRay act on every namespace); PYTEST_ARGS='-n 2' if you accept that.
PLANES ?= $(HOME)/.cache/ungater/test-planes
TESTS ?= tests/integration
PYTEST_ARGS ?=

test-fast: control-plane helm
	$(BIN)/ungater dev-cluster up --state-dir $(PLANES)/plain --no-peers
	$(BIN)/ungater dev-cluster up --state-dir $(PLANES)/kueue-v0.19.2 --kueue v0.19.2
	$(BIN)/ungater dev-cluster up --state-dir $(PLANES)/kueue-v0.17.1 --kueue v0.17.1
	UNGATER_TEST_PLANES=$(PLANES) $(BIN)/python -m pytest $(TESTS) -q $(PYTEST_ARGS)

# Stops every plane under PLANES (a Kueue started there by hand for $UNGATER_KUEUE_VERSION too).
test-planes-down: $(STAMP)
	for dir in $(PLANES)/*/; do [ ! -e "$$dir/pids.json" ] || $(BIN)/ungater dev-cluster down --state-dir "$$dir"; done

# The inner loop: lint, the unit suite (the world's first 40 seeds included), no control plane.
check: lint
	$(BIN)/python -m pytest tests/unit examples/ungater-leaderworkerset/tests -q -n 2

# Measured on two cores: the control plane 9.5 min, Kueue 5, KubeRay and JobSet 2.5 each.
demo: demo-notice control-plane
	$(BIN)/ungater demo

demo-notice:
	@echo "make demo: the first run on a new machine builds Kubernetes, etcd, Kueue, the KubeRay"
	@echo "operator and the JobSet controller from their Go modules (about 20 minutes on two cores,"
	@echo "progress every 30 s); later runs reuse them from ~/.cache/ungater and start in a minute."

# The benchmarks (docs/benchmarks.md): about 15 minutes on 2 cores; not part of `make test`,
# which runs only their smoke size (tests/integration/test_bench_smoke.py).
bench: control-plane
	$(BIN)/python -m bench run

# Mutation testing (docs/testing.md): slow (hours for every module on 2 cores), never run by CI.
# Scope it with MUTANTS, a mutmut name pattern: make mutation MUTANTS='ungater._decide.expectations*'
MUTANTS ?=
mutation: $(STAMP)
	$(BIN)/pip install -q -e '.[mutation]'
	$(BIN)/mutmut run --max-children 2 $(MUTANTS)
	$(BIN)/mutmut results

clean:
	rm -rf $(VENV) build *.egg-info mutants
