#!/usr/bin/env bash
# Install what the tests need (CPU torch first, so pip never pulls a CUDA build) and run them.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q "torch==2.13.0" || python -c "import torch" 
python -m pip install -q -e ".[test]"
python -m pytest -q -x -p no:cacheprovider tests "$@"
