#!/usr/bin/env bash
# Run the checks and the test suite. Tests run inside a network namespace with only loopback up
# (unshare --net) so that nothing can leave the machine; pytest arguments may be appended.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh >/dev/null

echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy"
.venv/bin/mypy
echo "== pytest"
if unshare --net true 2>/dev/null; then
    exec unshare --net sh -c 'ip link set lo up && exec .venv/bin/python -m pytest "$@"' sh "$@"
else
    echo "test: cannot create a network namespace (needs root); running on the host network" >&2
    exec .venv/bin/python -m pytest "$@"
fi
