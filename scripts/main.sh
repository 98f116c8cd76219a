#!/usr/bin/env bash
# The main job: installs pushpull, then trains a CNN on scikit-learn's bundled
# handwritten digits on an embedded local cluster (1 scheduler, 1 server,
# 2 workers on this machine), and fails if it misses its stated accuracy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec "${PYTHON:-python3}" -m pushpull launch --workers "${WORKERS:-2}" --servers "${SERVERS:-1}" -- \
  "${PYTHON:-python3}" examples/train_digits.py --min-accuracy 0.95 "$@"
