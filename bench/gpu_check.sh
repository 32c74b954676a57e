#!/usr/bin/env bash
# The device check of the CUDA slot pool and of GPU-true stage time, prepared to run once on a
# machine with a GPU: prints the device, driver and torch version, then runs, each under its
# own time limit (under 10 minutes in all, 570 s at most):
#   1. tests/test_ipc_cuda.py (its CUDA tests run there, instead of skipping)   90 s
#   2. bench/gpu_ipc.py: the bridge's rows and the pool's, with their checks     100 s
#   3. bench/gpu_ranks.py: the two-rank boundary hop for 1080p frames           140 s
#   4. examples/gpu_demo.py: render and decode on CUDA across two ranks          70 s
#   5. bench/gpu_timing.py: the engine's gpu_ms of a known kernel against CUDA   30 s
#      events taken by hand, compute_ms the launch (fails, not skips, without CUDA)
#   6. the whole suite with CUDA present                                         140 s
# and ends with "gpu_check: PASSED" (exit 0) or "gpu_check: FAILED" (exit 1). Each step's
# output is also written to $OUT/gpu_check_<step>.log when OUT is set (the device tool's $OUT).
#
#   bench/gpu_check.sh                 # python3, the one whose torch has CUDA
#   PY=/path/to/python bench/gpu_check.sh
#
# The python must have a CUDA build of torch. What else the package needs (reactivex,
# typing_extensions, structlog, pyyaml: pure Python) may come with the checkout, either as
# wheels in WHEELS (default shared/wheels; unpacked into a temporary directory on PYTHONPATH),
# or from a carried virtual environment (VENV, default .venv): every
# top-level package of its site-packages that this python cannot import is linked into that
# directory (never torch and its CUDA libraries: this python's own stay).
set -u
cd "$(dirname "$0")/.."
PY=${PY:-python3}
VENV=${VENV:-.venv}
WHEELS=${WHEELS:-shared/wheels}
OUT=${OUT:-}
status=0

echo "# bench/gpu_check.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
    || echo "nvidia-smi: not available"

DEPS=$(mktemp -d)
trap 'rm -rf "$DEPS"' EXIT
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    # unpacked as they are (a wheel is a zip): pyyaml's pure-Python part imports on any Python 3
    "$PY" - "$WHEELS" "$DEPS" <<'PYEOF'
import glob, os, sys, zipfile

wheels, deps = sys.argv[1], sys.argv[2]
names = sorted(glob.glob(os.path.join(wheels, "*.whl")))
for name in names:
    with zipfile.ZipFile(name) as wheel:
        wheel.extractall(deps)
print(f"# from {wheels}: {', '.join(os.path.basename(n).split('-')[0] for n in names)}")
PYEOF
fi
if [ -d "$VENV" ]; then
    "$PY" - "$VENV" "$DEPS" <<'PYEOF'
import glob, importlib.util, os, sys

venv, deps = sys.argv[1], sys.argv[2]
keep = ("torch", "functorch", "torchgen", "triton", "nvidia", "_distutils_hack", "pip", "setuptools",
        "__editable__")
linked = []
for site in glob.glob(os.path.join(venv, "lib", "python3*", "site-packages")):
    for entry in sorted(os.listdir(site)):
        name = entry.split(".")[0] if not entry.endswith(".dist-info") else None
        if not name or name.startswith(keep) or entry.endswith((".pth", ".dist-info")):
            continue
        if importlib.util.find_spec(name) is None:
            os.symlink(os.path.join(site, entry), os.path.join(deps, entry))
            linked.append(name)
print(f"# from {venv}: {', '.join(linked) if linked else 'nothing needed'}")
PYEOF
fi
export PYTHONPATH="$PWD:$DEPS${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c '
import sys, torch
cuda = torch.cuda.is_available()
print(f"# python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"available: {cuda}, device: {torch.cuda.get_device_name() if cuda else None}")
' || status=1

step() {
    local name=$1 limit=$2
    shift 2
    echo
    echo "## $name (at most ${limit} s): $*"
    local start rc
    start=$(date +%s)
    if [ -n "$OUT" ]; then
        timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/gpu_check_$name.log"
        rc=${PIPESTATUS[0]}
    else
        timeout --kill-after=10 "$limit" "$@" 2>&1
        rc=$?
    fi
    echo "## $name: exit $rc after $(( $(date +%s) - start )) s"
    [ "$rc" = 0 ] || status=1
}

step cuda_tests 90 "$PY" -m pytest tests/test_ipc_cuda.py -q -rs -p no:cacheprovider
step gpu_ipc 100 "$PY" bench/gpu_ipc.py
step gpu_ranks 140 "$PY" bench/gpu_ranks.py --frames 120 --fps 60
step gpu_demo 70 "$PY" examples/gpu_demo.py
step gpu_timing 30 "$PY" bench/gpu_timing.py
step suite 140 "$PY" -m pytest -q -p no:cacheprovider

echo
if [ "$status" = 0 ]; then echo "gpu_check: PASSED"; else echo "gpu_check: FAILED"; fi
exit "$status"
