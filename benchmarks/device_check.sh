#!/usr/bin/env bash
# Shell entry of benchmarks/device_check.py (issue 11's GPU check); see benchmarks/DEVICE_CHECK.md.
#
#   bash benchmarks/device_check.sh prepare         # HERE, once, in the repo root: fetch the wheels the device
#                                                   # machine lacks into .whl/ (ignored; name it in `carry`)
#   bash benchmarks/device_check.sh run "$OUT" ...  # THERE: install .whl/ into /tmp/site, then
#                                                   # python3 benchmarks/device_check.py --out "$OUT" ...
#
# The lent device machines reach no package registry. Their python3 (3.12) holds a CUDA torch (2.11), numpy,
# rich and typer, but not pydantic, which planner/ needs: `prepare` downloads pydantic and its needs as
# cp312 manylinux wheels (about 2.9 MB). Where `import torch` fails `run` tries `pip install torch==2.13.0
# numpy` -- that needs a registry, and the CUDA wheel with its nvidia-* libraries is several GB: a machine
# without both stops there (exit 3), saying so.
set -u
mode=${1:-}
shift || true
PY=${PYTHON:-python3}

case "$mode" in
prepare)
    [ -x .venv/bin/python ] && PY=${PYTHON:-.venv/bin/python}
    PYVER=${DEVICE_PYTHON_VERSION:-3.12}
    mkdir -p .whl
    # the versions this project is tested with (its venv), for the device machine's Python
    pins=$("$PY" - <<'EOF'
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in
               ("pydantic", "pydantic_core", "annotated_types", "typing_inspection", "typing_extensions")))
EOF
) || exit 2
    echo "downloading for Python $PYVER: $pins"
    # shellcheck disable=SC2086
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl $pins || exit 2
    ls -la .whl
    ;;
run)
    out=${1:?usage: device_check.sh run OUT_DIR [device_check.py options]}
    shift
    mkdir -p "$out"
    if ! "$PY" -c "import pydantic" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    fi
    if ! "$PY" -c "import torch" 2>/dev/null; then
        echo "device_check.sh: no torch in $PY; trying pip install torch==2.13.0 numpy (needs a registry; the" \
             "CUDA wheel and its nvidia-* libraries are several GB)"
        "$PY" -m pip install -q torch==2.13.0 numpy || { echo "device_check.sh: no torch, giving up"; exit 3; }
    fi
    if ! "$PY" -c "import numpy, pydantic" 2>/dev/null; then
        echo "device_check.sh: no pydantic/numpy in $PY and no usable .whl/ (run 'bash benchmarks/device_check.sh" \
             "prepare' here and name .whl in carry); trying pip install pydantic numpy"
        "$PY" -m pip install -q pydantic numpy || { echo "device_check.sh: no pydantic, giving up"; exit 3; }
    fi
    set -o pipefail
    PYTHONUNBUFFERED=1 "$PY" benchmarks/device_check.py --out "$out" "$@" 2>&1 | tee "$out/log.txt"
    rc=$?
    # the executor on NCCL, its ranks forked by executor/supervise.py (CUDA first touched in the rank): one
    # device, checked against single-process training; into log.txt (the device tool returns few files)
    if "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
        echo "== pipeplan run --backend nccl (1 GPU, gpt-tiny, --check) ==" | tee -a "$out/log.txt"
        timeout 300 "$PY" -m pipeplan.cli run --schedule 1f1b --devices 1 --microbatches 4 --model gpt-tiny \
            --backend nccl --check 2>&1 | tail -20 | tee -a "$out/log.txt"
    fi
    exit $rc
    ;;
*)
    echo "usage: bash benchmarks/device_check.sh prepare | run OUT_DIR [device_check.py options]" >&2
    exit 2
    ;;
esac
