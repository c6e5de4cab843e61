#!/usr/bin/env bash
# Pack TVM and the rest of autoplace's dependencies for the GPU machine, in carryable parts.
#
# Pack what the GPU machine needs to import autoplace and TVM into parts the device tool can
# carry (run here, where pip can reach the package registries; the GPU machine cannot).
#
#   .venv/bin/python -m benchmarks gpu_pack [PART_MB]     (default 30; or benchmarks/gpu_pack.sh)
#
# The GPU machine's image has Python 3.12 with numpy, scipy, matplotlib and PyTorch, but not
# TVM, its FFI, XGBoost, OR-Tools, networkx or tqdm. This downloads their CPython 3.12
# manylinux wheels (the versions of this checkout's .venv, else pyproject.toml's pins),
# installs them into one folder, leaves out what no build reads (CUTLASS's headers, TVM's web
# runtime), and writes it as one xz-compressed tar cut into parts of PART_MB MB:
# .gpu-pack/p1/, .gpu-pack/p2/, ... (ignored by git). TVM's wheel alone is about 100 MB, more
# than one device call carries (64 MiB with the working tree), so the parts travel one per call:
#
#   run(carry=[".gpu-pack/p1"], command="benchmarks/gpu_session.sh collect")
#   run(carry=[".gpu-pack/p2"], command="benchmarks/gpu_session.sh collect")
#   run(carry=[".gpu-pack/p3"], command="benchmarks/gpu_session.sh collect setup env ...")
#
# one right after another, while the machine is warm: `collect` keeps each part outside the
# working tree ($PARTS), and `setup` unpacks them once all are there ($SITE).
set -euo pipefail
cd "$(dirname "$0")/.."
PART_MB=${1:-30}
OUTDIR=.gpu-pack
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

version() {  # the installed version in .venv, else the pin in pyproject.toml
    local v=""
    if [[ -x .venv/bin/python ]]; then
        v=$(.venv/bin/python -c 'import sys, importlib.metadata as m; print(m.version(sys.argv[1]))' \
            "$1" 2>/dev/null || true)
    fi
    if [[ -z $v ]]; then
        v=$(grep -oE "\"$1==[^\"]+\"" pyproject.toml | head -1 | sed -E 's/.*==([^"]+)"/\1/')
    fi
    echo "$v"
}

specs=()
for name in apache-tvm apache-tvm-ffi xgboost-cpu ortools networkx tqdm; do
    v=$(version "$name")
    specs+=("$name${v:+==$v}")
done
echo "packing for CPython 3.12: ${specs[*]}"
platforms=()
for p in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 \
         manylinux_2_24 manylinux_2_17 manylinux2014; do
    platforms+=(--platform "${p}_x86_64")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$WORK/wheels" "${specs[@]}"
python3 -m pip install -q --no-deps --no-index --no-compile --target "$WORK/site" \
    --python-version 3.12 --implementation cp --only-binary=:all: "${platforms[@]}" \
    "$WORK"/wheels/*.whl
rm -rf "$WORK/site/tvm/3rdparty/cutlass" "$WORK/site/tvm/web" "$WORK/site/bin"
find "$WORK/site" -name __pycache__ -prune -exec rm -rf {} +
tar -cf - -C "$WORK/site" . | xz -T0 -6 > "$WORK/site.tar.xz"
rm -rf "$OUTDIR"
split -b "${PART_MB}M" -d -a 2 "$WORK/site.tar.xz" "$WORK/part."
parts=("$WORK"/part.*)
sum=$(sha256sum "$WORK/site.tar.xz" | cut -d' ' -f1)
for i in "${!parts[@]}"; do
    mkdir -p "$OUTDIR/p$((i + 1))"
    mv "${parts[$i]}" "$OUTDIR/p$((i + 1))/"
    printf 'parts=%d\nsha256=%s\n' "${#parts[@]}" "$sum" > "$OUTDIR/p$((i + 1))/manifest.txt"
done
du -sh "$OUTDIR"/p*
echo "carry $OUTDIR/p1 .. $OUTDIR/p${#parts[@]}, one per device call (see this script's header)"
