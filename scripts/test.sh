#!/usr/bin/env bash
# The whole test suite (what CI runs): install, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec "${PYTHON:-python3}" -m pytest -q "$@"
