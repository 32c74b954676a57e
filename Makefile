# The commands of README.md: `make demo`, `make test`, `make test-fast` and `make docs`. Each creates .venv when missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast docs bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch==2.13.0 first: the local CPU build. The range in pyproject.toml then installs nothing more.
$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The demo app headless on two ranks for 5 s (120 frames at 24 fps; render and decode on rank 1),
# its autopilot moving the mouse, steering and swapping the decoder: out/demo.mp4 (h264),
# out/timing.jsonl and the printed timing summary.
demo: $(STAMP)
	$(VENV)/bin/rxstream run examples/demo.py --ranks 2 --frames 120 --set autopilot=true \
		--out out/demo.mp4 --log out/timing.jsonl
	$(VENV)/bin/rxstream timing out/timing.jsonl --plot out/timing.png

test: $(STAMP)
	$(PY) -m ruff check rxstream tests bench examples
	$(PY) -m ruff format --check rxstream tests bench examples
	$(PY) -m mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mkdocs build --strict --quiet
	$(PY) -m pytest

# The fast lane while you work: the suite without the slow, browser, notebook and distributed
# marks (no lint). `make test` before a commit.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not browser and not notebook and not distributed"

# The docs site (mkdocs.yml): docs/ and the API reference from the docstrings, into build/site.
# Strict: a broken link, anchor or reference fails the build.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

# The quick user-facing benches (about 5 minutes). Not run here, see bench/README.md: peers.py
# (GStreamer, Ray), photon.py (Chromium; --net needs root), net_overhead.py (root), soak.py and
# the serve_* benches (minutes each), gpu_check.sh (a CUDA GPU).
bench: $(STAMP)
	$(PY) bench/hop.py
	$(PY) bench/timing_overhead.py
	$(PY) bench/pace.py
	$(PY) bench/ipc.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
