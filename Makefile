# Two set-up-and-go targets work on a fresh clone: `make demo` and `make test`.
# Both create .venv, install torch if the venv has none (or one older than TORCH_MIN), build the
# extension in place (pip -e) and run; `make test` also installs the test dependencies
# (TensorFlow among them), `make demo` does not. `make lint` / `make format` check / apply the
# Python (ruff) and C++/CUDA (clang-format) style.
#
# Which torch: an installed torch >= TORCH_MIN is reused as it is (the extension is built against
# whatever torch the venv has, and from then on needs that torch's major.minor). Otherwise
# TORCH_SPEC is installed, from pip's configured index by default (works offline with a local
# mirror; PyPI's Linux x86-64 torch wheels are CUDA builds), or from TORCH_INDEX when set:
#   CPU-only build:  make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
#   CUDA build:      make test TORCH_INDEX=https://download.pytorch.org/whl/cuXYZ
#                    (cuXYZ: a CUDA version that PyTorch publishes for that release, e.g. cu128)
#   other version:   make test TORCH_SPEC="torch==2.12.*"
# TORCH_INDEX replaces pip's index (--index-url); the download.pytorch.org indexes also serve
# torch's own dependencies. To switch a venv that already has a torch, remove that torch first
# ($(VENV)/bin/pip uninstall torch) or start from a new VENV.
#
# Rebuilds: `build` is a stamp file that depends on the C++/CUDA sources, setup.py,
# pyproject.toml, the core dependencies and the venv's torch version, so `make test` after
# `make demo` reuses the build; pip -e (which compiles everything in a fresh temp dir) only runs
# again when one of those changed. The compiler goes through ccache when it is installed.
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
TORCH_MIN ?= 2.4
TORCH_INDEX ?=
CORE_DEPS ?= numpy ninja
TEST_DEPS ?= pytest hypothesis tensorflow-cpu==2.21.0 h5py protobuf ruff==0.17.6
# tf-keras (Keras 2, for the tests where its behaviour differs) without its dependencies: it
# requires the `tensorflow` distribution, which would install the full TF beside tensorflow-cpu
# (the same `tensorflow` module).
TEST_NODEPS ?= tf-keras==2.21.0
LINT_DEPS ?= ruff==0.17.6 clang-format==19.1.7
CUDA_VENV ?= $(HOME)/.cache/torch_tfgrads/cuda-venv
CUDA_TORCH_SPEC ?= torch==2.15.0
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_BUILD := build/cuda-check
SAN_BUILD := build/sanitize
export MAX_JOBS ?= 2

# Stamps: what a venv has installed lives in the venv; the in-place build of this checkout lives
# in build/ (removed by `make clean`, like the .so), one per venv.
CORE_STAMP := $(VENV)/.tfgrads-core-deps
TEST_STAMP := $(VENV)/.tfgrads-test-deps
LINT_STAMP := $(VENV)/.tfgrads-lint-deps
TORCH_STAMP := $(VENV)/.tfgrads-torch-version
BUILD_STAMP := build/stamps/editable$(subst /,_,$(abspath $(VENV)))
BUILD_SOURCES := $(shell find csrc -type f) setup.py pyproject.toml
BUILD_CMD ?= $(VPY) -m pip install -q --no-build-isolation -e .
CXX_FORMAT_SOURCES = $(shell find csrc tools -type f \( -name '*.h' -o -name '*.c' -o -name '*.cpp' -o -name '*.cu' \) | sort)

# ccache: torch's extension builder puts `ccache` in front of the compiler by itself when ccache
# is on PATH (recent torch); for older torch, ccache's directory of compiler-named links goes
# first on PATH. Nothing changes without ccache. (CC/CXX="ccache g++" breaks the build, seen with
# torch 2.13: its ninja build takes CC's second word for a flag and quotes CXX as one command.)
# pip -e compiles in a new temp dir each time; ccache still hits because release builds have no
# debug info (with -g, ccache hashes the working directory).
CCACHE_LINKS := $(firstword $(wildcard /usr/lib/ccache /usr/lib64/ccache /usr/local/opt/ccache/libexec /opt/homebrew/opt/ccache/libexec))
ifneq ($(CCACHE_LINKS),)
export PATH := $(CCACHE_LINKS):$(PATH)
endif

.PHONY: demo test test-multiprocess build deps test-deps lint-deps lint format venv bench cuda-check sanitize \
	sanitize-build gpu-test clean FORCE

$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip setuptools wheel

venv: $(VPY)

FORCE:

# Runs every time (cheap: no torch import), but rewrites the stamp only when the venv's torch
# version changed, and so triggers a rebuild only then (`make -n` cannot know that and lists
# the build anyway). torch is installed only when missing or older than TORCH_MIN, and pinned:
# never let pip pull the newest (multi-GB) one.
$(TORCH_STAMP): $(VPY) FORCE
	@$(VPY) -c "import importlib.metadata as m, sys; \
	  v = lambda s: tuple(int(p) for p in s.split('+')[0].split('.')[:2]); \
	  sys.exit(v(m.version('torch')) < v('$(TORCH_MIN)'))" 2>/dev/null \
	  || $(VPY) -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	@$(VPY) -c "import importlib.metadata as m; print(m.version('torch'))" > $@.new
	@if cmp -s $@.new $@; then rm -f $@.new; else mv -f $@.new $@; echo "torch $$(cat $@)"; fi

$(CORE_STAMP): $(VPY) Makefile
	$(VPY) -m pip install -q $(CORE_DEPS)
	@touch $@

$(TEST_STAMP): $(VPY) Makefile
	$(VPY) -m pip install -q $(TEST_DEPS)
	$(VPY) -m pip install -q --no-deps $(TEST_NODEPS)
	@touch $@

$(LINT_STAMP): $(VPY) Makefile
	$(VPY) -m pip install -q $(LINT_DEPS)
	@touch $@

deps: $(TORCH_STAMP) $(CORE_STAMP)
test-deps: $(TEST_STAMP)
lint-deps: $(LINT_STAMP)

$(BUILD_STAMP): $(BUILD_SOURCES) $(TORCH_STAMP) $(CORE_STAMP)
	$(BUILD_CMD)
	@mkdir -p $(@D) && touch $@

build: $(BUILD_STAMP)

demo: build
	$(VPY) -m torch_tfgrads demo

test: build $(TEST_STAMP)
	$(VPY) -m pytest -q tests

# Only the tests that spawn torch.distributed processes (2 and 4 gloo ranks on CPU); `make test`
# runs them too.
test-multiprocess: build $(TEST_STAMP)
	$(VPY) -m pytest -q -m multiprocess tests

lint: $(LINT_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/clang-format --dry-run --Werror $(CXX_FORMAT_SOURCES)

# Sorts the imports (the one ruff lint fix that is formatting), formats Python and C++/CUDA.
format: $(LINT_STAMP)
	$(VENV)/bin/ruff check --select I --fix .
	$(VENV)/bin/ruff format .
	$(VENV)/bin/clang-format -i $(CXX_FORMAT_SOURCES)

bench: build $(TEST_STAMP)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(VPY) $$b || exit 1; done

# Proves the CUDA kernels compile and link against a CUDA build of torch, without a GPU: an
# out-of-tree copy is built with a cached venv's torch and /usr/local/cuda's nvcc, then imported
# (the in-tree CPU build is left alone). nvcc treats a host function called from device code as
# an error, and ptxas reports every kernel's registers: a spill fails the check. The build's
# output is in $(CUDA_BUILD)/build.log.
cuda-check:
	@test -n "$(NVCC)" || { echo "cuda-check: no nvcc found"; exit 1; }
	@test -x $(CUDA_VENV)/bin/python || $(PYTHON) -m venv $(CUDA_VENV)
	@$(CUDA_VENV)/bin/python -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('$(CUDA_TORCH_SPEC:torch==%=%)') and torch.version.cuda else 1)" 2>/dev/null \
	  || $(CUDA_VENV)/bin/pip install -q "$(CUDA_TORCH_SPEC)" numpy ninja setuptools wheel
	rm -rf $(CUDA_BUILD) && mkdir -p $(CUDA_BUILD)
	cp -r setup.py pyproject.toml README.md csrc torch_tfgrads $(CUDA_BUILD)/
	rm -f $(CUDA_BUILD)/torch_tfgrads/*.so $(CUDA_BUILD)/torch_tfgrads/_build_info.py
	cd $(CUDA_BUILD) && FORCE_CUDA=1 TFGRADS_PTXAS_VERBOSE=1 CUDA_HOME=$(dir $(patsubst %/,%,$(dir $(NVCC)))) \
	  TORCH_CUDA_ARCH_LIST=$${TORCH_CUDA_ARCH_LIST:-9.0} $(CUDA_VENV)/bin/python setup.py -q build_ext --inplace \
	  > build.log 2>&1 || { cat build.log; exit 1; }
	@cd $(CUDA_BUILD) && grep -q "ptxas info" build.log || { echo "cuda-check: no ptxas report"; exit 1; }
	@cd $(CUDA_BUILD) && if grep -E "[1-9][0-9]* bytes spill (stores|loads)" build.log; then \
	  echo "cuda-check: a kernel spills registers (above)"; exit 1; fi
	@cd $(CUDA_BUILD) && echo "cuda-check: $$(grep -c 'Used [0-9]* registers' build.log) kernels compiled, no spills"
	cd $(CUDA_BUILD) && $(CUDA_VENV)/bin/python -m torch_tfgrads check-build --require-cuda

# The CPU kernels under AddressSanitizer + UndefinedBehaviorSanitizer: an out-of-tree copy built
# with TFGRADS_SANITIZE=1 runs the whole test suite (bad inputs included) with the sanitizer
# runtimes preloaded into the venv's python; any finding aborts the run. (The in-tree build is
# left alone.) The multi-process tests and the forced-ISA-path reruns are left out: they run the
# same kernels as the rest of the suite, in spawned interpreters that would each load the
# sanitizer runtimes.
sanitize: sanitize-build $(TEST_STAMP)
	cd $(SAN_BUILD) && rm -f sanitizer.log.* && \
	  ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:log_path=$(abspath $(SAN_BUILD))/sanitizer.log \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$(abspath $(SAN_BUILD))/sanitizer.log \
	  LD_PRELOAD="$$($${CXX:-c++} -print-file-name=libasan.so):$$($${CXX:-c++} -print-file-name=libubsan.so)" \
	  sh -c '$(abspath $(VPY)) -c "import torch_tfgrads._C as c, sys; print(c.__file__); \
	    sys.exit(0 if \"$(SAN_BUILD)\" in c.__file__ else \"sanitize: not the sanitized build\")" \
	    && $(abspath $(VPY)) -m pytest -q -p no:cacheprovider -m "not multiprocess" \
	      --ignore=tests/test_forced_cpu_paths.py tests' \
	  || { echo "sanitize: FAILED; sanitizer reports (pytest's capture hides them):"; \
	       cat sanitizer.log.* 2>/dev/null; exit 1; }

sanitize-build: build
	rm -rf $(SAN_BUILD) && mkdir -p $(SAN_BUILD)
	cp -r setup.py pyproject.toml README.md CHANGELOG.md LICENSE docs tools benchmarks csrc torch_tfgrads tests $(SAN_BUILD)/
	rm -f $(SAN_BUILD)/torch_tfgrads/*.so $(SAN_BUILD)/torch_tfgrads/_build_info.py
	cd $(SAN_BUILD) && TFGRADS_SANITIZE=1 USE_CUDA=0 $(abspath $(VPY)) setup.py -q build_ext --inplace

# The GPU test kit, for a machine with a CUDA build of torch in `python3`, nvcc and no network:
# builds in place for the visible GPU, check-build --require-cuda, every needs_cuda test with
# TFGRADS_REQUIRE_CUDA=1, compute-sanitizer memcheck + racecheck over tools/cuda_smoke.py; a
# summary and logs in GPU_REPORT_DIR (default build/gpu-report). Installs nothing.
gpu-test:
	PYTHON=$${PYTHON:-python3} bash tools/gpu_test.sh

clean:
	rm -rf build torch_tfgrads/*.so torch_tfgrads/_build_info.py *.egg-info
