#!/bin/bash
# Compare kernel variants on the GPU machine in one device call. Each argument is a folder holding a
# tree of this repository; all are built at once (one engine cache each), then
# tools/profile_workloads.py $WORKLOAD (default: gradient) runs in each, one after another.
# The device copies the working tree without .git, so make the trees here first, in a folder that
# .git/info/exclude ignores, and carry it with .whl:
#   for rev in main wip/gradient-next; do mkdir -p .var/${rev//\//_}; git archive $rev | tar -x -C .var/${rev//\//_}; done
#   run: tools/variants.sh .var/main .var/wip_gradient-next      carry: [".whl", ".var"]
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
for tree in "$@"; do
  name=$(basename "$tree")
  (cd "$tree" && PYTHONPATH=/tmp/site:$PWD SWCLI_CACHE_DIR=/tmp/variants-cache/$name \
     python3 -c "from swcli._build import cuda_engine; cuda_engine()" > "$OUT/build_$name.log" 2>&1 \
     || echo "$tree: build failed, see $OUT/build_$name.log") &
done
wait
for tree in "$@"; do
  name=$(basename "$tree")
  echo "$tree: $(cd "$tree" && PYTHONPATH=/tmp/site:$PWD SWCLI_CACHE_DIR=/tmp/variants-cache/$name \
     python3 tools/profile_workloads.py ${WORKLOAD:-gradient} 2>&1 | tail -1)"
done
