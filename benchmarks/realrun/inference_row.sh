#!/usr/bin/env bash
# inference_row.sh NAME [REPOS_DIR]: one row of recipes-inference.tsv, a script that only
# evaluates: the realrun recipe (setup, original, single-file rewrite, torchrun and python of
# the migration, verify) with the migration's printed results compared with the original's
# line by line. ../shared/realrun/run-recipes counts a migration without
# DistributedDataParallel in its text as silent; an inference migration whose wrap served
# evaluation only has none (each rank evaluates with its own module), so these rows run here.
# Uses the harness's venv (DP2DDP_REALRUN_VENV).
set -u
name="$1"; KIT="$(cd "$(dirname "$0")" && pwd)"; PROJ="$(cd "$KIT/../.." && pwd)"; RV="${DP2DDP_REALRUN_VENV:-${TMPDIR:-/tmp}/dp2ddp-realrun-venv}"; SHIM="$(cd "$PROJ/../shared/realrun" && pwd)"; REPOS="${2:-/work/realrun-repos}"
line=$(grep -P "^$name\t" "$KIT/recipes-inference.tsv")
IFS=$'\t' read -r _ repo commit script wdir args renv setup notes <<< "$line"
[ "$renv" = "-" ] && renv=""; [ "$args" = "-" ] && args=""
read -r -a ARGS <<< "$args"
d="${TMPDIR:-/tmp}/infrow/$name"; rm -rf "$d"; mkdir -p "$d"; cp -r "$REPOS/${repo/\//+}" "$d/base"
shim() { env PYTHONPATH="$SHIM" PATH="$SHIM/bin:$RV/bin:$PATH" $renv "$@" </dev/null; }
if [ "$setup" != "-" ]; then read -r -a S <<< "${setup//@KIT@/$KIT}"; [ "${S[0]}" = python ] && S[0]="$RV/bin/python"; (cd "$d/base/$wdir" && shim OMP_NUM_THREADS=1 timeout 300 "${S[@]}" >"$d/setup.log" 2>&1) || { echo "$name: setup failed"; exit 1; }; fi
mig="${script%.py}_ddp.py"
(cd "$d/base/$wdir" && PYTHONPATH="$PROJ" "$RV/bin/python" -m dp2ddp rewrite "$script" -o "$mig" >"$d/rw.log" 2>&1); rrc=$?
grep -E "DDP[0-9]{3}" "$d/rw.log" | head -3
[ -f "$d/base/$wdir/$mig" ] || { echo "$name: refused (rewrite exit $rrc)"; exit 0; }
for r in o t p; do cp -r "$d/base" "$d/$r"; done
(cd "$d/o/$wdir" && shim OMP_NUM_THREADS=1 timeout 300 "$RV/bin/python" "$script" "${ARGS[@]}" >"$d/orig.out" 2>"$d/orig.err") || { echo "$name: original failed"; exit 1; }
(cd "$d/t/$wdir" && shim OMP_NUM_THREADS=1 timeout 400 "$RV/bin/torchrun" --standalone --nproc_per_node=2 "$mig" "${ARGS[@]}" >"$d/tr.out" 2>"$d/tr.err"); echo "torchrun exit $?"
(cd "$d/p/$wdir" && shim OMP_NUM_THREADS=1 timeout 300 "$RV/bin/python" "$mig" "${ARGS[@]}" >"$d/py.out" 2>"$d/py.err"); echo "python exit $?"
cmp -s "$d/orig.out" "$d/tr.out" && echo "printed: torchrun = original" || echo "printed: torchrun DIFFERS from the original"
cmp -s "$d/orig.out" "$d/py.out" && echo "printed: python = original" || echo "printed: python DIFFERS from the original"
(cd "$d/base/$wdir" && shim env PYTHONPATH="$PROJ:$SHIM" timeout 900 "$RV/bin/python" -m dp2ddp verify "$script" --migrated "$mig" --nproc 2 --steps 0 --min-speedup 0 --repeat 1 --json "$d/r.json" --workdir "$d/vw" -- "${ARGS[@]}" >"$d/verify.log" 2>&1); echo "verify exit $?"
grep -E "^(printed output|verdict|outputs)|inference only: the ranks" "$d/verify.log"
