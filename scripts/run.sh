#!/usr/bin/env bash
# Install/prepare everything, then start the server. Extra arguments go to the server, e.g.
#   ./scripts/run.sh --port 9000 --config my.toml
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m server --host "${HOST:-127.0.0.1}" --port "${PORT:-8080}" "$@"
