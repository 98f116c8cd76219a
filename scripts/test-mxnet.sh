#!/usr/bin/env bash
# The MXNet binding's tests in an environment of their own: mxnet 1.9.1 uses np.bool, which NumPy 1.24
# removed, so it cannot share the main environment's NumPy 2. Makes .venv-mxnet (git-ignored) with
# mxnet 1.9.1, NumPy < 1.24 and pushpull (editable), and without torch (the MXNet binding needs none: this
# environment is also the check that it does not), then runs
# tests/cluster/test_mxnet_api.py with it. --install-only: make the environment and stop (scripts/install.sh
# calls it that way, so CI's pytest run finds it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${PUSHPULL_MXNET_VENV:-.venv-mxnet}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
if ! "$VPY" -c 'import mxnet, numpy, sklearn, pushpull.mxnet' >/dev/null 2>&1; then
  # scikit-learn < 1.6 still supports NumPy 1.23 (the digits example and its split)
  "$VPY" -m pip install --quiet -e ".[mxnet,test]" "scikit-learn>=1.2,<1.6"
fi
"$VPY" -c 'import mxnet, pushpull.mxnet; print("mxnet", mxnet.__version__, "ready in '"$VENV"'")'
if [ "${1:-}" = "--install-only" ]; then
  exit 0
fi
export PUSHPULL_MXNET_PYTHON="$PWD/$VPY"
exec "$VPY" -m pytest -q tests/cluster/test_mxnet_api.py "$@"
