#!/usr/bin/env bash
# A GPU session's checklist: environment, overheads, latency, throughput and pipelines.
#
# A GPU session's checklist (issue 24, item 6): what a session lent the GPU machine runs, start
# to finish, in under 25 minutes.
#
#   benchmarks/gpu_session.sh [STEP ...]      (default: every step, in this order)
#   (.venv/bin/python -m benchmarks gpu_session [STEP ...] where a .venv exists; the GPU
#   machine has none before `setup`)
#
# Steps:
#   env        nvidia-smi, uptime, cores, commit, Python/TVM versions        -> env.txt
#   collect    (not run by default) keep the parts of benchmarks/gpu_pack.sh's pack carried in
#              this call (.gpu-pack/pN/) in $PARTS (default /root/gpu-parts), outside the
#              working tree, for `setup` in a later call
#   setup      a Python that imports autoplace and TVM: $PY if set, else .venv/bin/python,
#              else python3 with the pack unpacked into $SITE (default /root/gpu-site; every
#              part collected), else `make .venv/.installed` (needs the network) -> setup.log
#   overheads  the shipped profiles (H100, its host CPU...) imported into a store, their
#              overheads dropped, then `autoplace profile --only-overheads --device cpu:0
#              --device cuda:0` into it (every overhead measured again), and both devices
#              exported                 -> overheads.{json,log}, profile-*.json
#   latency    benchmarks/latency_plans.py on cpu:0 + cuda:0: the latency plans built, run and
#              timed against the GPU alone (and the CPU with all its cores)
#                                                        -> latency_plans.{json,log}
#   throughput benchmarks/throughput_plans.py on cpu:0 + cuda:0: the throughput plans optimize
#              returns, run against the GPU alone, the CPU with all its cores and replicas
#                                                        -> throughput_plans.{json,log}
#   pipeline   benchmarks/pipeline_throughput.py on cpu:0 + cuda:0: pipelines against the GPU
#              alone                                     -> pipeline_throughput.{json,log}
#
# The benchmarks cost their plans with the exported profiles (ops and the overheads just
# measured) when the machine's fingerprints match the shipped profiles' (the exports then hold
# measurements); otherwise with optimize's default costs and constant overheads, said in the log.
#
# Everything goes under $RESULTS (default benchmarks/results/gpu): a log per step and a
# summary.txt. Where $OUT is set (the device tool's folder, which brings back at most 8 files),
# the results folder is also packed into $OUT/gpu-session.tar.gz, with summary.txt beside it;
# unpack it into benchmarks/results/ and commit. Each step runs under its own `timeout`, and no
# step starts past the budget ($BUDGET_S seconds, default 1440: 24 minutes, counted from the
# start). A step that fails or times out is logged and the next one runs; the script exits 1 at
# the end if any failed or was skipped for want of time.
#
# CPU_DEVICE and GPU_DEVICE (default cpu:0, cuda:0) name the two devices; MODELS_LATENCY and
# MODELS_PIPELINE the models (zoo names; see the defaults below); ROUNDS the rounds of each
# benchmark (default 3).
#
# The device tool runs one command for at most 10 minutes and carries at most 64 MiB: pack
# TVM and the rest here with benchmarks/gpu_pack.sh, carry one part per call (`collect`), then
# run the steps with the last part: `RESULTS=/root/gpu-results BUDGET_S=540 ROUNDS=2
# benchmarks/gpu_session.sh collect setup env overheads latency throughput pipeline` took
# about 9.5 minutes on the H100 machine (setup 0.4, overheads 2, latency 2, throughput 3.3,
# pipeline 1.5). Steps left out can follow in a second call while the machine is warm
# (RESULTS outside the working tree, so that it finds the first's exports). A session's
# device time (15 minutes) holds the machine's start, the three calls and one such run.
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$(pwd)
RESULTS=${RESULTS:-benchmarks/results/gpu}
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
BUDGET_S=${BUDGET_S:-1440}
CPU=${CPU_DEVICE:-cpu:0}
GPU=${GPU_DEVICE:-cuda:0}
MODELS_LATENCY=${MODELS_LATENCY:-"zoo:resnet zoo:inception zoo:transformer zoo:mobilenet zoo:mlp"}
MODELS_PIPELINE=${MODELS_PIPELINE:-"resnet,inception,transformer,mobilenet,mlp"}
ROUNDS=${ROUNDS:-3}
SITE=${SITE:-/root/gpu-site}
PARTS=${PARTS:-/root/gpu-parts}
DB=$RESULTS/overheads.db
SHIPPED=autoplace/profile/shipped
SUMMARY=$RESULTS/summary.txt
START=$SECONDS
FAILED=()
export PYTHONUNBUFFERED=1

log() {
    echo "[$(date -u +%FT%TZ) +$((SECONDS - START))s] $*" | tee -a "$SUMMARY" >&2
}

# step NAME LIMIT_S COMMAND...: COMMAND under `timeout`, its output in $RESULTS/NAME.log.
step() {
    local name=$1 limit=$2 rc=0 why left
    shift 2
    left=$((BUDGET_S - (SECONDS - START) - 20))
    if ((left < 60)); then
        log "$name: SKIPPED (${left}s of the ${BUDGET_S}s budget left)"
        FAILED+=("$name (skipped)")
        return 0
    fi
    if ((limit > left)); then
        limit=$left
    fi
    log "$name: start (limit ${limit}s): $*"
    timeout -k 20 "$limit" "$@" >"$RESULTS/$name.log" 2>&1 || rc=$?
    if ((rc == 0)); then
        log "$name: ok"
        return 0
    fi
    if ((rc == 124 || rc == 137)); then why="timed out after ${limit}s"; else why="exit $rc"; fi
    log "$name: FAILED ($why); the end of $RESULTS/$name.log:"
    tail -n 8 "$RESULTS/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY" >&2
    FAILED+=("$name")
    return 0
}

pack() {
    if [[ -n ${OUT:-} && -d ${OUT:-} ]]; then
        tar czf "$OUT/gpu-session.tar.gz" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")" \
            || echo "packing $RESULTS into $OUT failed" >&2
        cp "$SUMMARY" "$OUT/summary.txt" 2>/dev/null || true
    fi
}
trap pack EXIT

choose_python() {
    if [[ -n ${PY:-} ]]; then
        return
    fi
    if [[ -x .venv/bin/python ]]; then
        PY=$REPO/.venv/bin/python
    elif [[ -d $SITE ]] || compgen -G ".gpu-pack/p*/part.*" >/dev/null \
            || compgen -G "$PARTS/part.*" >/dev/null; then
        PY=python3
        export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    else
        PY=$REPO/.venv/bin/python
    fi
}

do_env() {
    {
        echo "date: $(date -u +%FT%TZ)"
        echo "host: $(hostname)  cores: $(nproc)"
        echo "uptime: $(uptime)"
        echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
        echo "python: $PY"
        nvidia-smi || echo "nvidia-smi failed"
        "$PY" -c 'import tvm, autoplace; print("tvm", tvm.__version__, "cuda:0 exists:",
                  tvm.cuda(0).exist); print("autoplace", autoplace.__file__)' \
            || echo "autoplace/TVM do not import yet (the setup step installs them)"
    } >"$RESULTS/env.txt" 2>&1
}

do_setup() {
    if [[ -n ${PY:-} && $PY != "$REPO/.venv/bin/python" ]] && "$PY" -c 'import tvm' 2>/dev/null; then
        echo "using $PY"
    elif [[ -x .venv/bin/python ]]; then
        echo "using .venv"
    elif [[ -f $SITE/.unpacked ]]; then
        echo "using python3 with $SITE"
    elif compgen -G "$PARTS/part.*" >/dev/null || compgen -G ".gpu-pack/p*/part.*" >/dev/null
    then
        do_collect
        local want have
        want=$(sed -n 's/^parts=//p' "$PARTS/manifest.txt")
        have=$(find "$PARTS" -name 'part.*' | wc -l)
        if ((have != want)); then
            echo "only $have of the $want parts are in $PARTS: carry the others (collect)" >&2
            return 1
        fi
        if [[ $(cat "$PARTS"/part.* | sha256sum | cut -d' ' -f1) \
              != $(sed -n 's/^sha256=//p' "$PARTS/manifest.txt") ]]; then
            echo "the parts in $PARTS do not make the pack they came from" >&2
            return 1
        fi
        mkdir -p "$SITE"
        cat "$PARTS"/part.* | xz -d | tar -x -C "$SITE"
        touch "$SITE/.unpacked"
        echo "using python3 with the pack unpacked into $SITE"
    else
        make .venv/.installed
    fi
    "$PY" -c 'import tvm, autoplace; print("tvm", tvm.__version__, "cuda:0:", tvm.cuda(0).exist)'
}

do_collect() {
    local f n=0
    mkdir -p "$PARTS"
    for f in .gpu-pack/p*/part.* .gpu-pack/p*/manifest.txt; do
        if [[ -f $f ]]; then
            cp "$f" "$PARTS/"
            n=$((n + 1))
        fi
    done
    echo "collected $n files into $PARTS: $(cd "$PARTS" && ls part.* 2>/dev/null | xargs)"
}

do_overheads() {
    local dev f fp
    for f in "$SHIPPED"/*.json; do  # the shipped profiles, so that a device they match gets
        if [[ $f != *.xgb.json ]]; then  # its ops and its overheads in one export
            "$PY" -m autoplace profile-import "$f" --db "$DB"
        fi
    done
    # the imported overheads are dropped: they are measured again here, by this checkout's code
    "$PY" -c 'import sqlite3, sys
with sqlite3.connect(sys.argv[1]) as db:
    print("dropped", db.execute("DELETE FROM overheads").rowcount, "imported overheads")' "$DB"
    # the zoo's workloads a shipped host profile lacks (its GELU, dropped when CPU builds took
    # the fast erf): measured on the host CPU before the overheads, so the export has them
    "$PY" -m autoplace profile --model zoo:transformer --device "$CPU" --db "$DB" --no-links \
        --no-overheads --json >"$RESULTS/host-missing.json" \
        || echo "the host CPU's missing zoo workloads were not measured (see host-missing.json)"
    "$PY" -m autoplace profile --only-overheads --device "$CPU" --device "$GPU" --db "$DB" \
        --json >"$RESULTS/overheads.json"
    for dev in "$CPU" "$GPU"; do  # by fingerprint: a shipped profile may bear the same name
        fp=$("$PY" -c 'import sys; from autoplace import Device
from autoplace.profile import LocalRunner, fingerprint
print(fingerprint(LocalRunner(Device.from_spec(sys.argv[1])).info()))' "$dev")
        "$PY" -m autoplace profile-export --db "$DB" --device "$fp" \
            --out "$RESULTS/profile-${dev/:/}.json"
    done
    "$PY" - "$RESULTS" <<'EOF'
import json, sys
from pathlib import Path
for path in sorted(Path(sys.argv[1]).glob("profile-*.json")):
    data = json.loads(path.read_text())
    print(f"{path.name}: {data['device']['name']} {data['device']['fingerprint']} "
          f"({data['device']['info'].get('hardware')}), {len(data['measurements'])} measurements")
    for f in data.get("overheads", []):
        peer = f" with {f['detail'].get('peer')}" if f["peer"] else ""
        print(f"  {f['kind']}{peer}: {f['seconds'] * 1e6:.1f} us  ({f['detail'].get('method', '')})")
EOF
}

# The exported profiles, as --profile arguments, when both hold ops and overheads (one file
# per fingerprint: two devices of one kind and hardware share a profile).
profile_args() {
    local paths p
    PROFILE_ARGS=()
    if paths=$("$PY" - "$RESULTS" "${CPU/:/}" "${GPU/:/}" 2>>"$SUMMARY" <<'EOF'
import json, sys
from pathlib import Path
paths, seen = [Path(sys.argv[1]) / f"profile-{d}.json" for d in sys.argv[2:]], set()
for p in paths:
    if not p.exists():
        sys.exit(f"benchmarks cost with the defaults: no {p.name} (run the overheads step)")
    data = json.loads(p.read_text())
    if not data["measurements"] or not data.get("overheads"):
        sys.exit(f"benchmarks cost with the defaults: {p.name} holds "
                 f"{len(data['measurements'])} measurements and "
                 f"{len(data.get('overheads', []))} overheads (this machine's fingerprint is "
                 "not a shipped profile's)")
    if data["device"]["fingerprint"] not in seen:
        seen.add(data["device"]["fingerprint"])
        print(p)
print("benchmarks cost with " + " and ".join(p.name for p in paths)
      + " (measured ops and overheads)", file=sys.stderr)
EOF
    ); then
        for p in $paths; do
            PROFILE_ARGS+=(--profile "$p")
        done
    fi
}

STEPS=("$@")
if ((${#STEPS[@]} == 0)); then
    STEPS=(env setup overheads latency throughput pipeline)
fi
choose_python
log "gpu_session: steps ${STEPS[*]}; results in $RESULTS; budget ${BUDGET_S}s; python $PY"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export -f do_env do_setup do_collect do_overheads
export PY REPO RESULTS DB SHIPPED CPU GPU SITE PARTS

for s in "${STEPS[@]}"; do
    case $s in
        env) step env 60 bash -c do_env ;;
        collect) step collect 120 bash -euo pipefail -c do_collect ;;
        setup) step setup 600 bash -euo pipefail -c do_setup ;;
        overheads) step overheads 420 bash -euo pipefail -c do_overheads ;;
        latency)
            profile_args
            # shellcheck disable=SC2086 # the model list is words
            step latency 540 "$PY" benchmarks/latency_plans.py --models $MODELS_LATENCY \
                --device "$CPU" --device "$GPU" --rounds "$ROUNDS" --repeat 30 \
                --json "$RESULTS/latency_plans.json" ${PROFILE_ARGS[@]+"${PROFILE_ARGS[@]}"}
            ;;
        throughput)
            profile_args
            # shellcheck disable=SC2086 # the model list is words
            step throughput 420 "$PY" benchmarks/throughput_plans.py --models $MODELS_LATENCY \
                --device "$CPU" --device "$GPU" --rounds "$ROUNDS" --inputs 256 \
                --json "$RESULTS/throughput_plans.json" ${PROFILE_ARGS[@]+"${PROFILE_ARGS[@]}"}
            ;;
        pipeline)
            profile_args
            step pipeline 540 "$PY" benchmarks/pipeline_throughput.py --device "$CPU" \
                --device "$GPU" --inputs 64 --rounds "$ROUNDS" --no-halves \
                --models "$MODELS_PIPELINE" \
                --json "$RESULTS/pipeline_throughput.json" ${PROFILE_ARGS[@]+"${PROFILE_ARGS[@]}"}
            ;;
        *)
            log "unknown step $s (steps: collect env setup overheads latency throughput pipeline)"
            FAILED+=("$s (unknown)")
            ;;
    esac
done

log "uptime at the end: $(uptime)"
if ((${#FAILED[@]})); then
    log "gpu_session: done in $((SECONDS - START))s; FAILED: ${FAILED[*]}"
    exit 1
fi
log "gpu_session: done in $((SECONDS - START))s; every step ok"
