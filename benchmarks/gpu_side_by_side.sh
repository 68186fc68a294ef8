#!/usr/bin/env bash
# Breakout side by side on one GPU node, in one call of at most 9 minutes (see gpu_side_by_side.py).
#
#     python benchmarks/gpu_prep.py --python 3.12     # first, here: the peers' files and wheels
#     bash benchmarks/gpu_side_by_side.sh             # there, offline; carry benchmarks/.gpu_peers/peers
#                                                     # and benchmarks/.gpu_peers/wheels/cp312
#     bash benchmarks/gpu_side_by_side.sh --rehearse  # on a CPU, every run tiny
#
# The python is $PYTHON, else the first of python, python3 that imports torch.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-}
for candidate in python python3; do
    [ -n "$PYTHON" ] && break
    if command -v "$candidate" >/dev/null && "$candidate" -c "import torch" 2>/dev/null; then PYTHON=$(command -v "$candidate"); fi
done
[ -n "$PYTHON" ] || { echo "no python that imports torch on PATH (set PYTHON)"; exit 2; }
"$PYTHON" --version
"$PYTHON" -c "import torch; print('torch', torch.__version__, '| CUDA', torch.version.cuda, '|',
    torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device')"
nproc
exec "$PYTHON" benchmarks/gpu_side_by_side.py "$@"
