#!/usr/bin/env bash
# The GPU check: one command to run as is on a lent GPU machine (docs/running.md, "Running on a GPU").
#
#   bash scripts/gpu_check.sh --prepare     on a CPU machine with pip: download the wheels the GPU
#                                           image lacks (jsonschema and its needs) into .whl/ (ignored)
#   bash scripts/gpu_check.sh [--full] [--deadline S] OUTDIR
#                                           on the GPU machine: install the carried wheels (if .whl/ has
#                                           any) into a private folder, check the imports, run the gpu
#                                           test tier, then benchmarks/bench_gpu.py, all within S seconds
#   bash scripts/gpu_check.sh --cpu [--full] [--deadline S] OUTDIR
#                                           the same sequence on the CPU with a tiny model (no wheels):
#                                           tests/scripts/test_gpu_check.py runs it, so the script is known to
#                                           work before any GPU is lent
#
# The first call (no --full) measures what matters first: the tier without its compile test (the
# bench compiles and checks compiled against eager on its own model), then the bench's DGram
# retraction row (both polar solves), then its rows dgram, hetero, hetero-admm, stiefel, hetero-inv,
# none (none always kept: every ratio needs it). --full adds the tier's compile test and the bench's
# exercise row (evaluate, checkpoint, resume): for a second call, or a machine held longer.
# OUTDIR gets: versions.txt, gpu_tier.log, bench_gpu.log, bench_gpu.json, summary.txt, always (a stage
# the deadline left no time for says so in its file). The package runs from the source tree
# (PYTHONPATH=src): nothing is installed over the machine's own torch. One deadline for the whole
# script (default 270 s on a GPU, so that a machine start, the check and one rerun fit a 15-minute
# lease; 300 s with --cpu): the plan printed first says each stage's share, and each stage is killed
# (timeout -k) before it passes the deadline.
# Exit status: 0 everything passed, 1 a test, an import or the bench failed, 3 nothing failed but the
# deadline cut a stage short.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=.whl
# what the GPU image (Python 3.12, PyTorch 2.11) lacks; versions as the CI install resolves them
NEEDS=(jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1)

usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0; }

if [[ ${1:-} == --prepare ]]; then
    mkdir -p "$WHEELS"
    plat=()
    for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
        plat+=(--platform "$p")
    done
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${plat[@]}" -d "$WHEELS" "${NEEDS[@]}" || { echo "gpu_check: pip download failed" >&2; exit 1; }
    ls -1 "$WHEELS"
    echo "gpu_check: wheels in $WHEELS/ (carry it to the GPU machine with the tree)"
    exit 0
fi

mode=gpu
full=0
deadline=
if [[ ${1:-} == --cpu ]]; then mode=cpu; shift; fi
if [[ ${1:-} == --full ]]; then full=1; shift; fi
if [[ ${1:-} == --deadline ]]; then
    [[ ${2:-} =~ ^[0-9]+$ && ${2:-0} -ge 20 ]] || { echo "gpu_check: --deadline takes whole seconds, at least 20" >&2; usage; }
    deadline=$2; shift 2
fi
[[ $# -eq 1 && ${1:0:1} != - ]] || usage
[[ -n $deadline ]] || { [[ $mode == gpu ]] && deadline=270 || deadline=300; }
OUT=$1
mkdir -p "$OUT" || { echo "gpu_check: cannot create $OUT" >&2; exit 2; }
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
# a compile cache of its own, empty: the first compile is cold as on a fresh machine, every time
TORCHINDUCTOR_CACHE_DIR=$(mktemp -d /tmp/mwm-inductor.XXXXXX) || { echo "gpu_check: no temporary folder" >&2; exit 2; }
export TORCHINDUCTOR_CACHE_DIR
trap 'rm -rf "$TORCHINDUCTOR_CACHE_DIR"' EXIT
status=0
cut=0
note() { echo "gpu_check: $*" | tee -a "$OUT/summary.txt"; }
left() { echo $((deadline - SECONDS)); }  # seconds to the deadline (SECONDS counts from the start)
: >"$OUT/summary.txt"
: >"$OUT/gpu_tier.log"
: >"$OUT/bench_gpu.log"
echo '{"results": [], "note": "the bench did not start"}' >"$OUT/bench_gpu.json"
finish() {
    if [[ $status -eq 0 && $cut -eq 1 ]]; then status=3; fi
    note "done: exit $status ($SECONDS s of the ${deadline} s deadline)"
    exit $status
}

# -- 1. the carried wheels, into a private folder -------------------------------------------
if [[ $mode == gpu ]] && compgen -G "$WHEELS/*.whl" >/dev/null; then
    site=$(mktemp -d /tmp/mwm-site.XXXXXX)
    if $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        "$WHEELS"/*.whl; then
        export PYTHONPATH="$site"
        note "installed $(ls "$WHEELS"/*.whl | wc -l) carried wheels into $site"
    else
        note "FAILED to install the wheels in $WHEELS/"; status=1
    fi
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
missing=$($PY -c "
import importlib.util
print(' '.join(m for m in ('torch', 'numpy', 'yaml', 'jsonschema') if importlib.util.find_spec(m) is None))" 2>&1)
if [[ -n $missing ]]; then
    note "FAILED: $missing not importable here; on a CPU machine with pip run  bash scripts/gpu_check.sh --prepare"
    note "  and carry .whl/ with the tree (the device tool: carry [\".whl\"]), then run this again"
    status=1; finish
fi

# -- 2. imports and versions ------------------------------------------------------------------
if ! $PY - >"$OUT/versions.txt" 2>&1 <<'EOF'
import platform
from importlib.metadata import version
import torch, numpy, yaml, jsonschema
import mwm, mwm.train, mwm.config, mwm.measure.syncs
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"numpy {numpy.__version__}, jsonschema {version('jsonschema')}, mwm {mwm.__version__} from {mwm.__file__}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"GPU {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs, "
          f"capability {p.major}.{p.minor}, bf16 {torch.cuda.is_bf16_supported()}")
else:
    print("no CUDA device")
EOF
then
    cat "$OUT/versions.txt" >&2
    note "FAILED: the package does not import (versions.txt)"; status=1; finish
fi
note "$(cat "$OUT/versions.txt" | tr '\n' ' ')"
if [[ $mode == gpu ]] && ! grep -q "^GPU " "$OUT/versions.txt"; then
    note "FAILED: no CUDA device here; use --cpu on a machine without one"; status=1; finish
fi

# -- 3. the gpu test tier: a share of what is left, so the bench always gets its turn ---------------
device=cuda
[[ $mode == cpu ]] && device=cpu
TIER_SHARE=30  # percent of what is left; the tier without its compile test takes seconds on a CPU
if [[ $mode == gpu ]]; then margin=15; else margin=5; fi  # the bench's table and exit, after its budget
markers="gpu and not gpu_full"
[[ $full -eq 1 ]] && markers=gpu
tier_limit=$(( $(left) * TIER_SHARE / 100 ))
exercise=(--exercise none-of-them)
[[ $full -eq 1 ]] && exercise=(--exercise hetero)
if [[ $mode == gpu ]]; then
    bench=(--steps 10 --warmup 3)
else
    # compiled like the GPU's: the tiny model's cold compile is about the share of this deadline that
    # GPT-2 small's is of the GPU's, so the rehearsal meets the same schedule
    bench=(--device cpu --layers 2 --embd 32 --heads 2 --block 32 --vocab 320 --batch 2 --steps 10 --warmup 3
           --dual-steps 3 --threads 1 --compile)
fi
note "plan for the ${deadline} s deadline ($SECONDS s gone on wheels and imports): the gpu tier ($markers) at most ${tier_limit} s$([[ $full -eq 1 ]] || echo " (--full adds its compile test and the exercise row)");"
note "  bench_gpu in what is left less ${margin} s: $($PY benchmarks/bench_gpu.py "${bench[@]}" "${exercise[@]}" --plan)"
start=$SECONDS
MWM_TEST_DEVICE=$device timeout -k 5 $tier_limit $PY -m pytest -q -s -p no:cacheprovider -m "$markers" \
    tests/train/test_gpu.py >"$OUT/gpu_tier.log" 2>&1
rc=$?
tier=$(grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed|error)" "$OUT/gpu_tier.log" | tail -n 1)
if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    note "gpu tier on $device: cut by the deadline after $((SECONDS - start)) s (its limit ${tier_limit} s)"; cut=1
else
    note "gpu tier on $device: rc $rc, $((SECONDS - start)) s: ${tier:-no summary line}"
    [[ $rc -eq 0 ]] || status=1
fi
grep -oE "msign bf16 \(.*" "$OUT/gpu_tier.log" | while read -r line; do note "  $line"; done

# -- 4. the benchmark: what is left, less a margin for its table and exit -----------------------------
start=$SECONDS
limit=$(( $(left) - 5 ))
if [[ $limit -lt $((margin + 20)) ]]; then
    note "bench_gpu: cut by the deadline before it started (${limit} s left)"; cut=1
    echo "not started: ${limit} s left before the deadline" >"$OUT/bench_gpu.log"
    finish
fi
timeout -k 5 $limit $PY benchmarks/bench_gpu.py "${bench[@]}" "${exercise[@]}" --budget-s $((limit - margin)) \
    --json "$OUT/bench_gpu.json" >"$OUT/bench_gpu.log" 2>&1
rc=$?
if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    # killed before its table: the rows it printed as they finished
    grep -E "^(DGram retraction|cut by|dgram |hetero|stiefel |none )" "$OUT/bench_gpu.log" | tee -a "$OUT/summary.txt"
    note "bench_gpu: cut by the deadline after $((SECONDS - start)) s; the rows it finished are in bench_gpu.json"
    cut=1
else
    sed -n '/^bench_gpu summary:/,$p' "$OUT/bench_gpu.log" | tail -n +2 | tee -a "$OUT/summary.txt"
    note "bench_gpu: rc $rc, $((SECONDS - start)) s (results in bench_gpu.json, written after every row)"
    if [[ $rc -ne 0 ]]; then
        tail -n 20 "$OUT/bench_gpu.log" | tee -a "$OUT/summary.txt"
        status=1
    fi
fi
finish
