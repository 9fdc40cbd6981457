# The two commands of the README:
#   make run    do the whole DLBricks job on the default corpus
#   make test   run the tests
# and `make lint` for ruff, buildifier and the import-cycle check (as in CI).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BUILDIFIER_VERSION := 8.2.1
BUILDIFIER := .ci/node/node_modules/.bin/buildifier
# Bazel files of this workspace; .venv holds TensorFlow's own BUILD files.
STARLARK_FILES = $(shell find . \( -name .venv -o -name .ci -o -name .git \
	-o -name node_modules -o -name 'bazel-*' \) -prune -o \( -name BUILD \
	-o -name BUILD.bazel -o -name WORKSPACE -o -name '*.bzl' \) -print)

.PHONY: run test lint

run: $(STAMP)
	@if [ -f tools/dlbricks.py ]; then \
		$(BIN)/python -m tools.dlbricks; \
	elif [ -f benchmarks/decompose_corpus.py ]; then \
		$(BIN)/python benchmarks/decompose_corpus.py; \
	else \
		echo "make run: neither tools/dlbricks.py nor" \
			"benchmarks/decompose_corpus.py exists" >&2; \
		exit 1; \
	fi

test: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(BIN)/python -m pytest tests

lint: $(STAMP) $(BUILDIFIER)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BUILDIFIER) -lint=warn -mode=check $(STARLARK_FILES)
	.ci/check_bazel_targets
	.ci/check_imports

# Reinstall only when the requirements or the project metadata change.
$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check \
		-r requirements.txt -e .
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps \
		-r requirements-nodeps.txt
	touch $@

$(BUILDIFIER):
	npm install --no-save --no-audit --no-fund --prefix .ci/node \
		@bazel/buildifier@$(BUILDIFIER_VERSION)
