# Two set-up-and-go targets work on a fresh clone: `make demo` and `make test`.
# Both create .venv, install torch 2.13.0 (CPU) if missing, the test dependencies, build the
# extension in place (pip -e), then run.
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
TEST_DEPS := numpy pytest ninja tensorflow-cpu==2.21.0
CUDA_VENV ?= $(HOME)/.cache/torch_tfgrads/cuda-venv
CUDA_TORCH_SPEC ?= torch==2.15.0
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_BUILD := build/cuda-check
SAN_BUILD := build/sanitize
export MAX_JOBS ?= 2

.PHONY: demo test build deps venv bench cuda-check sanitize sanitize-build clean

$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip setuptools wheel

venv: $(VPY)

# torch is only installed when missing, and pinned: never let pip pull the newest (multi-GB) one.
deps: $(VPY)
	@$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install -q "$(TORCH_SPEC)"
	$(VPY) -m pip install -q $(TEST_DEPS)

build: deps
	$(VPY) -m pip install -q --no-build-isolation -e .

demo: build
	$(VPY) -m torch_tfgrads parity

test: build
	$(VPY) -m pytest -q tests

bench: build
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(VPY) $$b || exit 1; done

# Proves the CUDA kernels compile and link against a CUDA build of torch, without a GPU: an
# out-of-tree copy is built with a cached venv's torch and /usr/local/cuda's nvcc, then imported
# (the in-tree CPU build is left alone).
cuda-check:
	@test -n "$(NVCC)" || { echo "cuda-check: no nvcc found"; exit 1; }
	@test -x $(CUDA_VENV)/bin/python || $(PYTHON) -m venv $(CUDA_VENV)
	@$(CUDA_VENV)/bin/python -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('$(CUDA_TORCH_SPEC:torch==%=%)') and torch.version.cuda else 1)" 2>/dev/null \
	  || $(CUDA_VENV)/bin/pip install -q "$(CUDA_TORCH_SPEC)" numpy ninja setuptools wheel
	rm -rf $(CUDA_BUILD) && mkdir -p $(CUDA_BUILD)
	cp -r setup.py pyproject.toml README.md csrc torch_tfgrads $(CUDA_BUILD)/
	rm -f $(CUDA_BUILD)/torch_tfgrads/*.so $(CUDA_BUILD)/torch_tfgrads/_build_info.py
	cd $(CUDA_BUILD) && FORCE_CUDA=1 CUDA_HOME=$(dir $(patsubst %/,%,$(dir $(NVCC)))) \
	  TORCH_CUDA_ARCH_LIST=$${TORCH_CUDA_ARCH_LIST:-9.0} $(CUDA_VENV)/bin/python setup.py -q build_ext --inplace
	cd $(CUDA_BUILD) && $(CUDA_VENV)/bin/python -m torch_tfgrads check-build --require-cuda

# The CPU kernels under AddressSanitizer + UndefinedBehaviorSanitizer: an out-of-tree copy built
# with TFGRADS_SANITIZE=1 runs the whole test suite (bad inputs included) with the sanitizer
# runtimes preloaded into the venv's python; any finding aborts the run. (The in-tree build is
# left alone.)
sanitize: sanitize-build
	cd $(SAN_BUILD) && rm -f sanitizer.log.* && \
	  ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:log_path=$(abspath $(SAN_BUILD))/sanitizer.log \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$(abspath $(SAN_BUILD))/sanitizer.log \
	  LD_PRELOAD="$$($${CXX:-c++} -print-file-name=libasan.so):$$($${CXX:-c++} -print-file-name=libubsan.so)" \
	  sh -c '$(abspath $(VPY)) -c "import torch_tfgrads._C as c, sys; print(c.__file__); \
	    sys.exit(0 if \"$(SAN_BUILD)\" in c.__file__ else \"sanitize: not the sanitized build\")" \
	    && $(abspath $(VPY)) -m pytest -q -p no:cacheprovider tests' \
	  || { echo "sanitize: FAILED; sanitizer reports (pytest's capture hides them):"; \
	       cat sanitizer.log.* 2>/dev/null; exit 1; }

sanitize-build: build
	rm -rf $(SAN_BUILD) && mkdir -p $(SAN_BUILD)
	cp -r setup.py pyproject.toml README.md csrc torch_tfgrads tests $(SAN_BUILD)/
	rm -f $(SAN_BUILD)/torch_tfgrads/*.so $(SAN_BUILD)/torch_tfgrads/_build_info.py
	cd $(SAN_BUILD) && TFGRADS_SANITIZE=1 USE_CUDA=0 $(abspath $(VPY)) setup.py -q build_ext --inplace

clean:
	rm -rf build torch_tfgrads/*.so torch_tfgrads/_build_info.py *.egg-info
