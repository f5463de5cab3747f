#!/usr/bin/env bash
# Run a command in the "slow profile": a machine like the 2-core AVX2-only laptops and cloud VMs
# our users have, reproduced on a faster one.
#
#   scripts/slow.sh [--cpus N] [--one-core] COMMAND [ARGS...]
#
# - The libraries are told to skip AVX-512 (CTranslate2, oneDNN, PyTorch, MKL).
# - The command and everything it starts get at most N CPUs of time (a CFS quota in a cgroup of
#   their own, 20 ms period; default 0.5, or 1 with --one-core alone: the whole of core 0). On the machines we develop on, the ISA caps alone
#   did not slow Whisper tiny.en down (0.43 s per call against 0.50 s), while 0.5 CPUs gave
#   1.5-1.9 s per call, the figure measured on a real 2-core AVX2 machine (1.1-1.8 s).
# - --one-core also pins it to core 0 (taskset -c 0), for the heaviest tests.
# The cgroup needs root; without it the command runs with the ISA caps only, and says so.
set -euo pipefail

cpus=""
one_core=0
while [ $# -gt 0 ]; do
    case "$1" in
        --cpus) cpus="$2"; shift 2 ;;
        --one-core) one_core=1; shift ;;
        --) shift; break ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || { echo "usage: scripts/slow.sh [--cpus N] [--one-core] COMMAND..." >&2; exit 2; }
[ -n "$cpus" ] || { [ "$one_core" = 1 ] && cpus=1 || cpus=0.5; }

export CT2_FORCE_CPU_ISA=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2
export ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2

period_us=20000
quota_us=$(awk -v c="$cpus" -v p="$period_us" 'BEGIN { printf "%d", c * p }')
group=""
if [ -w /sys/fs/cgroup/cgroup.subtree_control ] 2>/dev/null; then
    # cgroup v2: cpu.max is "quota period"
    group=/sys/fs/cgroup/avatar-slow-$$
    mkdir "$group" && echo "$quota_us $period_us" >"$group/cpu.max" || group=""
elif [ -w /sys/fs/cgroup/cpu/cgroup.procs ]; then
    group=/sys/fs/cgroup/cpu/avatar-slow-$$
    mkdir "$group" && echo "$period_us" >"$group/cpu.cfs_period_us" \
        && echo "$quota_us" >"$group/cpu.cfs_quota_us" || group=""
fi
cleanup() { [ -z "$group" ] || rmdir "$group" 2>/dev/null || true; }
trap cleanup EXIT

pin=()
[ "$one_core" = 0 ] || pin=(taskset -c 0)
# run the command as a child and pass SIGTERM/SIGINT on to it (a server stopped through this
# wrapper shuts down, instead of living on without it); returns its exit status
run() {
    "$@" &
    child=$!
    trap 'kill -TERM "$child" 2>/dev/null' TERM INT
    local code=0
    wait "$child" || code=$?
    while kill -0 "$child" 2>/dev/null; do  # a trapped signal interrupted the wait
        code=0
        wait "$child" || code=$?
    done
    return "$code"
}
cpu_model=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
avx512=$(grep -qw avx512f /proc/cpuinfo && echo yes || echo no)
if [ -n "$group" ]; then
    echo "slow profile: $cpu_model (AVX-512: $avx512) capped to AVX2, $cpus CPUs$([ "$one_core" = 0 ] || echo ', core 0 only')" >&2
    # the child joins the cgroup, then becomes the command (so the trap here can remove the group)
    status=0
    run sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$group" "${pin[@]}" "$@" \
        || status=$?
    exit "$status"
fi
echo "slow profile: no writable cgroup (needs root): ISA caps only$([ "$one_core" = 0 ] || echo ', core 0 only')" >&2
status=0
run "${pin[@]}" "$@" || status=$?
exit "$status"
