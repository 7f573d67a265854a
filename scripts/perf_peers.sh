#!/bin/bash
# The peer comparison (grpcgrade against the HTTP reward servers users run instead), from this working tree.
#
#   scripts/perf_peers.sh PEERS PEER_VENV WORK [harness bench.py options...]
#   make perf-peers PEERS=../shared/perf-peers [PEER_ARGS="--workloads json --sizes 512,8192 --reps 3"]
#
#   PEERS      the harness folder (perf-peers: bench.py, client.py, peer_server.py, perfdata.py, run.sh)
#   PEER_VENV  the peers' venv: built on first use, as the harness's run.sh builds it (FastAPI,
#              uvicorn[standard], aiohttp, requests, py-spy, sacrebleu, math-verify, every shared library
#              pinned to .venv's versions), except that the constraints leave out .venv's editable (-e) and
#              direct-URL (@) lines, which pip refuses as constraints
#   WORK       data, logs, results.json, and report.md (the harness's markdown table)
#
# Every run reinstalls grpcgrade and its math-verify plugin into PEER_VENV from this working tree (the
# harness's client side: reward_function, GradingClient), uncommitted changes included; the server under
# test is .venv's `grpcgrade serve` (`make serve` or `make test` builds .venv). A manual measurement tool:
# the project's tests never read the harness.
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,17p' "$0"; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$1/bench.py" ] || { echo "perf_peers: no harness at $1 (bench.py missing); pass PEERS=<its folder>" >&2; exit 2; }
peers=$(cd "$1" && pwd)
venv=$2 work=$3
shift 3
gvenv=$root/.venv
[ -x "$gvenv/bin/grpcgrade" ] || { echo "perf_peers: no $gvenv/bin/grpcgrade: run make serve first" >&2; exit 2; }
mkdir -p "$work"
work=$(cd "$work" && pwd)

# the working tree's tracked and new files (no venvs, nothing ignored), as the harness's git archive does
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
git -C "$root" ls-files -z --cached --others --exclude-standard | (cd "$root" && xargs -0 tar -cf - 2>/dev/null) | tar -x -C "$src"

cd /tmp  # pip must not read anything of the project's folder as an option or a package
if [ ! -x "$venv/bin/uvicorn" ] || [ ! -x "$venv/bin/py-spy" ] \
  || ! "$venv/bin/python" -c "import grpcgrade, grpcgrade_math_verify, aiohttp, fastapi, sacrebleu" 2>/dev/null; then
  echo "perf_peers: building the peers' venv $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$gvenv/bin/python" -m pip freeze 2>/dev/null | grep -v -i '^grpcgrade' | grep -v '^-e' | grep -v ' @ ' \
    > "$venv/constraints.txt"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q -c "$venv/constraints.txt" "$src" "$src/plugins/grpcgrade-math-verify" \
    fastapi "uvicorn[standard]" aiohttp requests py-spy sacrebleu "math-verify[antlr4_13_2]"
else
  "$venv/bin/pip" install -q --no-deps --force-reinstall "$src" "$src/plugins/grpcgrade-math-verify"
fi

# The peers have no result cache: ours is off, so repeated reps of the same data time grading, not the cache.
# (A --grpcgrade-args in PEER_ARGS comes later and wins: keep --config there if you pass it.)
echo "cache: {enabled: false}" > "$work/no-cache.yaml"
"$venv/bin/python" "$peers/bench.py" --grpcgrade-bin "$gvenv/bin/grpcgrade" --perfdata "$peers/perfdata.py" \
  --work "$work" --grpcgrade-args "--config $work/no-cache.yaml" "$@" | tee "$work/bench.log"
# the markdown table and the parity line, for docs/performance.md
sed -n '/^| workload /,/^reward parity/p' "$work/bench.log" > "$work/report.md"
echo "perf_peers: the table is in $work/report.md" >&2
