#!/usr/bin/env bash
# Run the checks and the test suite. Tests run inside a network namespace with only loopback up
# (unshare --net) so that nothing can leave the machine; pytest arguments may be appended.
#
#   scripts/test.sh [--ordinary | --stress | --slow [--cpus N]] [--one-core] [PYTEST ARGS...]
#
# --ordinary runs pytest in the ordinary profile of scripts/slow.sh (AVX-512 off, 1.0 CPU: the
# machine the latency goals are for), --stress (or --slow) in the stress profile (0.5 CPU unless
# --cpus says otherwise); --one-core pins it to core 0 (alone: AVX-512 off and the whole of core 0).
# The tests scale their waits by the slowness they measure at start (tests/support/pace.py),
# so the suite passes there too.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=()
while [ $# -gt 0 ]; do
    case "$1" in
        --ordinary) profile+=(--cpus 1); shift ;;
        --stress | --slow) profile+=(--cpus 0.5); shift ;;
        --cpus) profile+=(--cpus "$2"); shift 2 ;;
        --one-core) profile+=(--one-core); shift ;;
        *) break ;;
    esac
done
run=()
[ ${#profile[@]} = 0 ] || run=(./scripts/slow.sh "${profile[@]}" --)

./scripts/setup.sh >/dev/null

echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy"
.venv/bin/mypy
echo "== pytest"
if unshare --net true 2>/dev/null; then
    exec "${run[@]}" unshare --net sh -c 'ip link set lo up && exec .venv/bin/python -m pytest "$@"' sh "$@"
else
    echo "test: cannot create a network namespace (needs root); running on the host network" >&2
    exec "${run[@]}" .venv/bin/python -m pytest "$@"
fi
