#!/usr/bin/env bash
# The accelerator's figures of issue 12 (bench/bench_gpu.py) in one prepared run, on a machine with an NVIDIA GPU
# whose python3 holds a CUDA build of torch but not Teto's other dependencies (docs/performance.md, "The
# accelerator's figures").
#
#   bash bench/gpu_device.sh wheels       here, where pip can download: the pure-Python dependencies the benchmark
#                                         imports besides torch, as wheels into .whl/ (PYVER: the GPU machine's
#                                         Python, default 3.12), at the versions this checkout's .venv holds
#   bash bench/gpu_device.sh run [DIR] [ARGS...]
#                                         there: install .whl/ (when present) into a private folder, run the
#                                         benchmark, write DIR/gpu.json (DIR: $OUT, else the current directory);
#                                         ARGS go to bench_gpu (--quick, --steps N, --peak-tflops X, --peak-gbps Y);
#                                         PYTHON: the interpreter that holds torch (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(pydantic pydantic_core annotated-types typing-inspection)

case "${1:-run}" in
  wheels)
    py=.venv/bin/python
    [ -x "$py" ] || py=python3
    pins=()
    for name in "${WHEELS[@]}"; do
      pins+=("$name==$("$py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")")
    done
    mkdir -p .whl
    exclude=$(git rev-parse --git-path info/exclude)  # a worktree's too
    mkdir -p "$(dirname "$exclude")"
    grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "${PYVER:-3.12}" --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .whl "${pins[@]}"
    ls .whl
    ;;
  run)
    shift || true
    dir=${OUT:-.}
    if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then dir=$1; shift; fi
    if compgen -G ".whl/*.whl" > /dev/null; then
      site=$(mktemp -d /tmp/teto-site-XXXXXX)
      "${PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" .whl/*.whl
      export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
    PYTHONUNBUFFERED=1 "${PYTHON:-python3}" -m bench.bench_gpu --json "$dir/gpu.json" "$@"
    ;;
  *)
    echo "usage: bash bench/gpu_device.sh wheels | run [DIR] [ARGS...]" >&2
    exit 2
    ;;
esac
