#!/usr/bin/env bash
# Run a command in a profile: a machine like the 2-core AVX2-only laptops and cloud VMs our users
# have, reproduced on a faster one.
#
#   scripts/slow.sh ordinary COMMAND [ARGS...]   AVX-512 off, 1.0 CPU: the machine the latency
#                                                goals are for (a real 2-core AVX2 laptop)
#   scripts/slow.sh stress COMMAND [ARGS...]     AVX-512 off, 0.5 CPU: goals are about behaving
#                                                well there, not speed
#   scripts/slow.sh fast COMMAND [ARGS...]       the host as it is (runs the command unchanged)
#   scripts/slow.sh [--cpus N] [--one-core] COMMAND [ARGS...]   any quota (default 0.5: stress)
#
# - The libraries are told to skip AVX-512 (CTranslate2, oneDNN, PyTorch, MKL).
# - The command and everything it starts get at most N CPUs of time (a CFS quota in a cgroup of
#   their own, 20 ms period). Per stage, 1.0 CPU matched a real 2-core AVX2 machine (ASR 79
#   against 108-116 ms, LLM first token 152 against 126 ms), 0.5 CPU was 2-3x slower.
# - --one-core also pins it to core 0 (taskset -c 0), for the heaviest tests (with --one-core
#   alone the quota is 1: the whole of core 0).
# - Benchmarks print the profile with their figures (server/machine.py tells it from the caps
#   and the quota it sees).
# The cgroup needs root; without it the command runs with the ISA caps only, and says so.
set -euo pipefail

cpus=""
one_core=0
profile=""
case "${1:-}" in
    ordinary) profile=ordinary; cpus=1; shift ;;
    stress) profile=stress; cpus=0.5; shift ;;
    fast)
        shift
        [ $# -gt 0 ] || { echo "usage: scripts/slow.sh fast COMMAND..." >&2; exit 2; }
        echo "fast profile: the host as it is" >&2
        unset CT2_FORCE_CPU_ISA ONEDNN_MAX_CPU_ISA DNNL_MAX_CPU_ISA ATEN_CPU_CAPABILITY \
            MKL_ENABLE_INSTRUCTIONS
        exec "$@"
        ;;
esac
while [ $# -gt 0 ]; do
    case "$1" in
        --cpus) cpus="$2"; shift 2 ;;
        --one-core) one_core=1; shift ;;
        --) shift; break ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || {
    echo "usage: scripts/slow.sh {ordinary|stress|fast} COMMAND... or [--cpus N] [--one-core] COMMAND..." >&2
    exit 2
}
[ -n "$cpus" ] || { [ "$one_core" = 1 ] && cpus=1 || cpus=0.5; }
if [ -z "$profile" ]; then
    case "$cpus" in
        1 | 1.0) profile=ordinary ;;
        0.5) profile=stress ;;
        *) profile="custom ($cpus CPUs)" ;;
    esac
fi

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
    echo "$profile profile: $cpu_model (AVX-512: $avx512) capped to AVX2, $cpus CPUs$([ "$one_core" = 0 ] || echo ', core 0 only')" >&2
    # the child joins the cgroup, then becomes the command (so the trap here can remove the group)
    status=0
    run sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$group" "${pin[@]}" "$@" \
        || status=$?
    exit "$status"
fi
echo "$profile profile: no writable cgroup (needs root): ISA caps only$([ "$one_core" = 0 ] || echo ', core 0 only')" >&2
status=0
run "${pin[@]}" "$@" || status=$?
exit "$status"
