# Quick start: `make demo` installs and runs the main job; `make test` installs and runs the tests.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# the scheduler core's hot modules, compiled with mypyc at install (setup.py, core/_native.py);
# the build records the sources it compiled here, and a changed source is rebuilt before use
NATIVE := src/arl_tangram/core/_compiled.json
CORE_SRC := $(wildcard src/arl_tangram/core/*.py) src/arl_tangram/managers/cpu/zygote/_fastpath.c

.PHONY: install compile demo test lint bench clean system-deps mutation mutation-diff judge-engine

$(STAMP): pyproject.toml setup.py
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU build of torch lies on this kind of machine; pinning it first keeps pip from
	# pulling CUDA wheels. On a GPU machine, install the torch you want before `make install`.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[dev,gpu,ray]"
	touch $(STAMP)
	@if [ -f $(NATIVE) ]; then touch $(NATIVE); fi

# Rebuild the compiled core after an edit of a core source (else the core runs as pure Python,
# with a warning; ARL_TANGRAM_COMPILE=0 make ... never compiles).
$(NATIVE): $(STAMP) $(CORE_SRC)
	$(BIN)/pip install --quiet --no-deps -e .
	@if [ -f $(NATIVE) ]; then touch $(NATIVE); fi

install: $(STAMP)
ifneq ($(ARL_TANGRAM_COMPILE),0)
install: $(NATIVE)
endif
# The judge engine (issue 38): vLLM in its own venv under .venv/engines/vllm (its pins differ from
# the service's: scripts/judge-engine.sh says which); ARL_TANGRAM_JUDGE=0 make ... skips it.
ifneq ($(ARL_TANGRAM_JUDGE),0)
install: judge-engine
endif

judge-engine: $(STAMP)
	PY=$(PY) bash scripts/judge-engine.sh $(VENV)/engines/vllm

compile: $(NATIVE)

# Debian packages the tests use: headless Chromium for the dashboard test, toolchains for sandboxes.
system-deps:
	@bash scripts/system-deps.sh

demo: install
	$(BIN)/tangram demo

# TEST_COVERAGE=FILE: the same run under coverage (pyproject's [tool.coverage.run]), each test's
# lines under its node id (tests/_coverage_context.py), written to FILE: .ci/run hands it to the
# check of changed lines (scripts/mutation_diff.py --coverage FILE)
test: install system-deps
	$(BIN)/python $(if $(TEST_COVERAGE),-m coverage run --data-file=$(TEST_COVERAGE)) \
		-m pytest -q -p no:cacheprovider

# ruff, mypy, and the import contracts between the rooms (pyproject.toml [tool.importlinter])
lint: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports

# Mutation testing (issue 27, docs/testing.md): mutmut over pyproject's [tool.mutmut] modules, in a
# copy of HEAD; prints the score per module. Slow: not part of `make test` or `.ci/run`. Narrow a
# run with MUTANTS='arl_tangram.api.middleware*' and MUTATION_TESTS='tests/api/test_api.py ...'.
mutation: install
	$(BIN)/python scripts/mutation.py $(MUTANTS) $(if $(MUTATION_TESTS),--tests $(MUTATION_TESTS))

# The mutants of the lines changed since .ci/mutation-base (or MUTATION_BASE..HEAD), against the
# tests that reach them, within MUTATION_DIFF_BUDGET_S (240 s); fails on a changed line no test
# reaches or a surviving mutant (scripts/mutation_diff.py, docs/testing.md section 5). Here it
# measures the rooms' tests itself; MUTATION_COVERAGE=FILE reads a `make test TEST_COVERAGE=FILE`
# run's data instead, as .ci/run does.
mutation-diff: install
	$(BIN)/python scripts/mutation_diff.py $(if $(MUTATION_BASE),--base $(MUTATION_BASE)) \
		$(if $(MUTATION_COVERAGE),--coverage $(MUTATION_COVERAGE))

bench: install
	$(BIN)/python benchmarks/bench_core.py
	$(BIN)/python benchmarks/bench_sim.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info src/*.so src/arl_tangram/core/*.so $(NATIVE) \
		src/arl_tangram/managers/cpu/*.so src/arl_tangram/managers/cpu/zygote/*.so
