#!/usr/bin/env bash
# project_row.sh NAME [REPOS_DIR]: one row of recipes.tsv as a project migration: the realrun
# recipe (setup, original, then torchrun, python and verify of the migration) with
# `dp2ddp rewrite --with-helpers -o DIR` in place of the single-file rewrite, which
# ../shared/realrun/run-recipes cannot express. Uses the harness's venv (DP2DDP_REALRUN_VENV).
set -u
name="$1"; KIT="$(cd "$(dirname "$0")" && pwd)"; PROJ="$(cd "$KIT/../.." && pwd)"; RV="${DP2DDP_REALRUN_VENV:-${TMPDIR:-/tmp}/dp2ddp-realrun-venv}"; SHIM="$(cd "$PROJ/../shared/realrun" && pwd)"; REPOS="${2:-/work/realrun-repos}"
line=$(grep -P "^$name\t" $KIT/recipes.tsv)
IFS=$'\t' read -r _ repo commit script wdir args renv setup notes <<< "$line"
[ "$renv" = "-" ] && renv=""; [ "$args" = "-" ] && args=""
read -r -a ARGS <<< "$args"
d="${TMPDIR:-/tmp}/projrow/$name"; rm -rf "$d"; mkdir -p "$d"; cp -r $REPOS/${repo/\//+} "$d/base"
shim() { env PYTHONPATH="$SHIM" PATH="$SHIM/bin:$RV/bin:$PATH" $renv "$@" </dev/null; }
if [ "$setup" != "-" ]; then read -r -a S <<< "${setup//@KIT@/$KIT}"; [ "${S[0]}" = python ] && S[0]="$RV/bin/python"; (cd "$d/base/$wdir" && shim OMP_NUM_THREADS=1 timeout 300 "${S[@]}" >"$d/setup.log" 2>&1) || { echo "$name: setup failed"; exit 1; }; fi
cp -r "$d/base" "$d/o"
(cd "$d/o/$wdir" && shim OMP_NUM_THREADS=1 timeout 300 "$RV/bin/python" "$script" "${ARGS[@]}" >"$d/orig.log" 2>&1) || { echo "$name: original failed"; exit 1; }
(cd "$d/base/$wdir" && PYTHONPATH="$PROJ" "$RV/bin/python" -m dp2ddp rewrite "$script" --with-helpers -o "$d/mig" >"$d/rw.log" 2>&1); rrc=$?
grep -E "DDP[0-9]{3}" "$d/rw.log" | head -5
[ -d "$d/mig" ] || { echo "$name: refused (rewrite exit $rrc)"; exit 0; }
for r in t p; do cp -r "$d/mig" "$d/$r"; done
(cd "$d/t/$wdir" && shim OMP_NUM_THREADS=1 timeout 400 "$RV/bin/torchrun" --standalone --nproc_per_node=2 "$script" "${ARGS[@]}" >"$d/tr.log" 2>&1); echo "torchrun exit $?"
(cd "$d/p/$wdir" && shim OMP_NUM_THREADS=1 timeout 300 "$RV/bin/python" "$script" "${ARGS[@]}" >"$d/py.log" 2>&1); echo "python exit $?"
(cd "$d/base/$wdir" && shim env PYTHONPATH="$PROJ:$SHIM" timeout 1200 "$RV/bin/python" -m dp2ddp verify "$script" --migrated "$d/mig/$wdir/$script" --nproc 2 --steps 0 --min-speedup 0 --repeat 1 --json "$d/r.json" --workdir "$d/vw" -- "${ARGS[@]}" >"$d/verify.log" 2>&1); echo "verify exit $?"
grep -E "^(losses agree|max relative|replicas|verdict|outputs|data)" "$d/verify.log"
