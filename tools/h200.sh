#!/bin/bash
# GPU runner: build, test, fuzz, benchmark and profile the CUDA engine on a GPU machine; logs go to $OUT.
#   tools/h200.sh STAGE...   run from the repository root, stages in the order given:
#     build      compile and load the CUDA engine, print the GPU
#     test       the fast GPU suite: pytest -m "cuda and not slow" (stops at the first failure)
#     test-slow  the long GPU sweeps: pytest -m "cuda and slow"
#     dist-test  tests/test_distributed.py whole (its runs of 2 ranks, CPU and CUDA): its NCCL failure tests
#                need 2 GPUs (nvidia-h200-x2) and skip on one; about 3 minutes
#     gpu-all    every test, on 14 workers
#     bench      swcli bench --backend cuda --json (kept as $OUT/bench.json), printed as a table
#     fuzz       benchmarks/fuzz_scaled.py cuda ($FUZZ_CONFIGS configurations, default 120)
#     log-pairs  benchmarks/log_space_pairs.py: pairs the scaled sweep hands to log space
#     floor      benchmarks/gradient_floor.py: the memory floor of a recomputing gradient
#     affine-widths  benchmarks/affine_gradient_widths.py: the affine gradient by rows against the state's path
#     learnable  forward + backward with the gaps' and the temperature's gradients against S's alone, 8192 x 256 x 256
#                (benchmarks/profile_workloads.py learnable), linear -1 and affine -12/-1, t = 1
#     long-pairs benchmarks/long_pairs.py: 35,000 x 35,000 and 12,000 x 10,000 by tiles (forward; forward + backward)
#                beside one warp per pair, and both paths around the automatic choice's limits (kept as $OUT/long_pairs.json)
#     sanitize   compute-sanitizer memcheck and racecheck on small cases of every kernel family (the search's too)
#     e2e        swcli align on $E2E_PAIRS (1,000,000) real pairs, then bench's end-to-end rows
#     profile    an ncu report of benchmarks/profile_workloads.py $NCU_WORKLOAD (kernels, train or latency), its
#                kernels by the regex $NCU_KERNELS (default forward|codes|backward); $NCU_SCRIPT replaces the
#                script and its arguments, e.g. NCU_KERNELS=search_soft NCU_SCRIPT="benchmarks/search_soft.py
#                .bench/proteins.fasta --repeats 1" for the soft search kernel's launches, length class by class
#     steps      seed-shaped batches of growing size in graph replay (benchmarks/profile_workloads.py steps)
#     host       host time per call of the op and the operators (benchmarks/profile_workloads.py host)
#     clocks     SM clock, power and throttle reasons under the dense forward
#     search     swcli search beside CUDASW++4.0 (benchmarks/search_peer.py; record in $OUT/search): CUDASW4's
#                20 queries against make-db's 100,000 sequences; about 5 minutes, CUDASW4's build included;
#                gap -4, or affine with GAP_OPEN and GAP_EXTEND (e.g. -11 and -1)
#     search-blocks  the search's blocks cut at the exact kernel's tile classes or not, and the soft kernel for
#                long queries or not (benchmarks/search_blocks.py): the scoring time of CUDASW4's 20 queries
#                against make-db's database, linear -4 and affine -11/-1; about 2 minutes with make-db
#     search-sizes  the same search's scoring time by block size (benchmarks/search_blocks.py --max-cells: 2^24,
#                2^26 and 2^28 padded target residues a block), the exact kernel and the soft one (its rescaled
#                segments 24 or 40 bits below U), gap -4; about 3 minutes with make-db
#     soft-search  the soft search kernel block by block (benchmarks/search_soft.py): GCUPS per length class at t = 1
#                beside the general op (and the exact kernel at t = 0), flagged pairs, error against float64; gap -4
#                and -11/-1; about 2 minutes
#     details    what --format-output's 21 columns (and --rank evalue) cost in that search, at t = 0 and 1
#                (benchmarks/details_speed.py; affine GAP_OPEN/GAP_EXTEND, default -11/-1); about 3 minutes
#     dist-overhead  swcli search under torchrun --nproc-per-node 1, and as one rank without torchrun, against
#                the plain command (benchmarks/distributed_overhead.py, outputs compared): CUDASW4's 20 queries, each
#                DIST_QUERY_COPIES (20) times, against make-db's 100,000 sequences prepared by makedb;
#                DIST_REPEATS (3) runs each after a warm-up, and torchrun's cost with nothing to run; then
#                the exchange per query alone through NCCL (benchmarks/distributed_exchange.py); about 6
#                minutes with make-db
#     dist-scale swcli search on every GPU of the machine (torchrun, one rank a GPU) against one process, and
#                CUDASW++4.0 on the same GPUs (benchmarks/distributed_scaling.py; record in $OUT/scaling): CUDASW4's
#                20 queries (SCALE_QUERY_COPIES times, default 1) against make-db's 800 copies (200,000
#                sequences, about 100 M residues), t = 0 and 1, gap -4, SCALE_REPEATS (3) runs each; for the
#                nvidia-h200-x2 machine; about 6 minutes with make-db and CUDASW4's build
# Needs the biopython wheel in .whl/ and .bench/proteins.fasta (250 real proteins) in the tree; search, details and
# dist-overhead also need .peer/ (the peers folder: peer-cudasw4, cudasw4/, zlib1g-dev.deb) with make-db in .peer/tools/.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 SWCLI_CACHE_DIR=${SWCLI_CACHE_DIR:-/tmp/swcli-cache}
FASTA=.bench/proteins.fasta
for stage in "$@"; do
  echo "=== $stage $(date +%T)"
  case $stage in
    build)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
      python3 -c "import time, torch; from swcli.ops import load_engine; t = time.time(); load_engine('cuda'); \
print(f'CUDA engine built and loaded in {time.time() - t:.1f} s, torch {torch.__version__}')" 2>&1 | tee "$OUT/build.log" ;;
    test)
      timeout ${TEST_LIMIT:-300} python3 -m pytest -q -x -m "cuda and not slow" -p no:cacheprovider --durations=8 tests 2>&1 \
        | tee "$OUT/test_cuda.log" | tail -25 ;;
    test-slow)
      timeout ${SLOW_TEST_LIMIT:-540} python3 -m pytest -q -m "cuda and slow" -p no:cacheprovider --durations=8 tests 2>&1 \
        | tee "$OUT/test_cuda_slow.log" | tail -25 ;;
    dist-test)
      timeout ${DIST_TEST_LIMIT:-540} python3 -m pytest -q -p no:cacheprovider -rs --durations=8 tests/test_distributed.py \
        2>&1 | tee "$OUT/test_distributed.log" | tail -25 ;;
    gpu-all)
      timeout 480 python3 -m pytest -q -p no:cacheprovider -n 14 --durations=15 tests 2>&1 | tee "$OUT/test_all.log" | tail -25 ;;
    bench)
      timeout 300 python3 -m swcli bench --backend cuda --fasta $FASTA --pairs 0 --json > "$OUT/bench.json" 2> "$OUT/bench.err"
      python3 -c "import json; d = json.load(open('$OUT/bench.json')); print(d['machine']); \
[print(f\"{r['workload']:<24} {r['backend']:<9} t={r['temperature']:<3} {r['seconds'] * 1e6:>12,.1f} us {r['gcups']:>9.1f} GCUPS  {r['note']}\") for r in d['rows']]" \
        || tail -20 "$OUT/bench.err" ;;
    fuzz)
      timeout 400 python3 benchmarks/fuzz_scaled.py cuda ${FUZZ_CONFIGS:-120} 2>&1 | tee "$OUT/fuzz.txt" | tail -25 ;;
    log-pairs)
      python3 benchmarks/log_space_pairs.py $FASTA 2>&1 | tee "$OUT/log_pairs.txt" ;;
    floor)
      python3 benchmarks/gradient_floor.py 2>&1 | tee "$OUT/floor.txt" ;;
    affine-widths)
      python3 benchmarks/affine_gradient_widths.py 2>&1 | tee "$OUT/affine_widths.txt" ;;
    learnable)
      timeout 300 python3 benchmarks/profile_workloads.py learnable 2>&1 | tee "$OUT/learnable.txt" ;;
    long-pairs)
      timeout 500 python3 benchmarks/long_pairs.py --out "$OUT/long_pairs.json" 2>&1 | tee "$OUT/long_pairs.txt" ;;
    sanitize)
      # PYTORCH_NO_CUDA_MEMORY_CACHING only for the sanitizer's runs: later stages capture CUDA graphs,
      # which cannot allocate outside the caching allocator
      cat > /tmp/small.py <<'PY'
import torch, swcli
from swcli.ops import soft_smith_waterman_codes
g = torch.Generator().manual_seed(1)
for B, M, N in [(5, 37, 70), (1100, 9, 300), (16, 40, 32)]:  # the last: one column tile, one scale per warp
    S = torch.randn(B, M, N, generator=g).cuda().requires_grad_()
    q = torch.randint(0, M + 1, (B,), generator=g).cuda(); t = torch.randint(0, N + 1, (B,), generator=g).cuda()
    for temp in (0.0, 1.0):
        swcli.soft_smith_waterman(S, -1.0, temp, q, t).sum().backward()
        swcli.soft_smith_waterman(S.detach(), -1.0, temp, q, t)  # without the table: the scaled sweep at t > 0
        codes_q = torch.randint(0, 24, (B, M), generator=g, dtype=torch.uint8).cuda()
        codes_t = torch.randint(0, 24, (B, N), generator=g, dtype=torch.uint8).cuda()
        soft_smith_waterman_codes(codes_q, codes_t, torch.randn(24, 24).cuda(), -1.0, temp, q, t)
# codes: 12 long pairs relayed by blocks of warps among 1088 short ones, 8 columns per lane (gap -1) and 4
# (gap -30, past kWideLimit); t = 0 and 1. 300 x 900 (8 tiles) as given, 900 x 300 transposed (and about
# half of the short pairs)
qlen, tlen = torch.randint(1, 21, (1100,), generator=g), torch.randint(1, 21, (1100,), generator=g)
qlen[:8], tlen[:8] = 300, 900
qlen[8:12], tlen[8:12] = 900, 300
codes_q = torch.randint(0, 24, (1100, 900), generator=g, dtype=torch.uint8).cuda()
codes_t = torch.randint(0, 24, (1100, 900), generator=g, dtype=torch.uint8).cuda()
for temp, gap in ((0.0, -1.0), (1.0, -1.0), (1.0, -30.0)):
    soft_smith_waterman_codes(codes_q, codes_t, torch.randn(24, 24).cuda(), gap, temp, qlen.cuda(), tlen.cuda())
# the gradient by rows (float32, t > 0; through the op from N = 129, or 193 with lengths: ops.gradient_by_rows):
# full rows over 38 bands, masked lanes with lengths, and rows of 250 floats (not 16-byte aligned: through
# the staging row)
for B, M, N, lengths in ((64, 300, 256, False), (200, 30, 200, True), (40, 90, 250, False)):
    S = torch.randn(B, M, N, generator=g).cuda().requires_grad_()
    q = torch.randint(0, M + 1, (B,), generator=g).cuda() if lengths else None
    tl = torch.randint(0, N + 1, (B,), generator=g).cuda() if lengths else None
    swcli.soft_smith_waterman(S, -1.0, 1.0, q, tl).sum().backward()
# the rows with (B,) gaps and temperature read on the device (ops._RowsPerPair): every pair its own values,
# pairs at t = 0, with a gap > 0 (linear) or past the shared form (affine), all counted: the table's path
for B, M, N, lengths in ((64, 300, 256, False), (200, 30, 200, True), (40, 90, 250, False)):
    S = torch.randn(B, M, N, generator=g).cuda().requires_grad_()
    q = torch.randint(0, M + 1, (B,), generator=g).cuda() if lengths else None
    tl = torch.randint(0, N + 1, (B,), generator=g).cuda() if lengths else None
    t = torch.linspace(0.5, 1.5, B).cuda()
    gap = torch.linspace(-2.0, -0.5, B).cuda().requires_grad_()
    swcli.soft_smith_waterman(S, gap, t.requires_grad_(), q, tl).sum().backward()
    swcli.soft_smith_waterman(S, None, t, q, tl, gap_open=gap - 1.0, gap_extend=gap).sum().backward()
    t = t.detach().clone(); t[1] = 0.0; t[2] = 0.01
    swcli.soft_smith_waterman(S, torch.where(torch.arange(B).cuda() == 3, 0.5, gap), t, q, tl).sum().backward()
    swcli.soft_smith_waterman(S, None, t, q, tl, gap_open=gap - 1.0, gap_extend=gap).sum().backward()
# full pairs whose last tile is narrower than a tile (300 = 2 x 128 + 44): lanes past it, last rows
S = torch.randn(1100, 40, 300, generator=g).cuda().requires_grad_()
swcli.soft_smith_waterman(S, -1.0, 1.0).sum().backward()
swcli.soft_smith_waterman(S.detach(), -1.0, 1.0)
# affine gaps: forward + backward (1 and 4 columns per lane, several tiles, lengths), scores from codes with
# transposed and relayed pairs (1, 4 and 8 columns per lane), t = 0 and 1, and t = 0.05 (separate cells)
for B, M, N in [(5, 37, 70), (1100, 9, 300), (3, 1, 1)]:
    S = torch.randn(B, M, N, generator=g).cuda().requires_grad_()
    q = torch.randint(0, M + 1, (B,), generator=g).cuda(); tl = torch.randint(0, N + 1, (B,), generator=g).cuda()
    for temp in (0.0, 1.0, 0.05):
        swcli.soft_smith_waterman(S, None, temp, q, tl, gap_open=-3.0, gap_extend=-0.5).sum().backward()
        swcli.soft_smith_waterman(S.detach(), None, temp, q, tl, gap_open=-3.0, gap_extend=-0.5)
# the affine gradient by rows: full rows over 38 bands, masked lanes with lengths, unaligned rows of 250
for B, M, N, lengths in ((64, 300, 256, False), (200, 30, 200, True), (40, 90, 250, False)):
    S = torch.randn(B, M, N, generator=g).cuda().requires_grad_()
    q = torch.randint(0, M + 1, (B,), generator=g).cuda() if lengths else None
    tl = torch.randint(0, N + 1, (B,), generator=g).cuda() if lengths else None
    swcli.soft_smith_waterman(S, None, 1.0, q, tl, gap_open=-3.0, gap_extend=-0.5).sum().backward()
for temp in (0.0, 1.0):
    for lanes in (1, 4, 8):
        torch.ops.swcli.affine_scores_codes(codes_q, codes_t, torch.randn(24, 24).cuda(), qlen.cuda(), tlen.cuda(),
                                            -11.0, -1.0, temp, lane_columns=lanes)
# tensor gaps and temperature with gradients (the backward kernels' SUMS instantiations): the table and the
# traceback at t = 0, distinct values (a group a pair), the rows with lengths and full, the affine state
# (past 256 columns) and rows
for B, M, N, lengths, distinct in ((5, 37, 70, True, True), (64, 40, 256, False, False), (40, 30, 200, True, False),
                                   (6, 20, 300, False, False)):
    S = torch.randn(B, M, N, generator=g).cuda().requires_grad_()
    q = torch.randint(0, M + 1, (B,), generator=g).cuda() if lengths else None
    tl = torch.randint(0, N + 1, (B,), generator=g).cuda() if lengths else None
    for temp in (0.0, 1.0):
        t = torch.tensor(temp, device="cuda", requires_grad=temp > 0)
        gap = (torch.linspace(-2.0, -0.5, B) if distinct else torch.tensor(-1.0)).cuda().requires_grad_()
        swcli.soft_smith_waterman(S, gap, t, q, tl).sum().backward()
        swcli.soft_smith_waterman(S, None, t, q, tl, gap_open=gap - 2.0, gap_extend=-0.5).sum().backward()
# the exact 16-bit search kernel: tile shapes from 64 to past 1024 columns, short and odd queries, linear and
# affine, and a matrix whose self-matches pass int16 (flagged pairs)
from swcli.scoring import load_matrix
from swcli.search import Block, ExactSearch
B62 = load_matrix("BLOSUM62").tensor(device="cuda")
for width, M in ((64, 1), (200, 33), (513, 300), (1100, 77)):
    tl = torch.randint(0, width + 1, (300,), generator=g).sort(descending=True).values; tl[0] = width
    codes_t = torch.randint(0, 24, (300, width), generator=g, dtype=torch.uint8).cuda()
    query = torch.randint(0, 24, (M,), generator=g, dtype=torch.uint8).cuda()
    for gaps in ((-4, -4), (-11, -1)):
        ExactSearch(B62, *gaps).scores(query, Block(codes_t, tl.cuda(), torch.zeros_like(tl).cuda()))
big = torch.full((24, 24), -3.0, device="cuda"); big.fill_diagonal_(1000.0)
ExactSearch(big, -4, -4).scores(codes_t[0, :40].contiguous(), Block(codes_t[:, :40].contiguous(),
                                torch.full((300,), 40, device="cuda"), torch.zeros(300, dtype=torch.int64).cuda()))
# tiles of long pairs (lane_columns -1 at a small size): partial tiles, lengths, rows of S unaligned (270) and
# aligned (272), t = 0 and 1, forward and backward
for N in (270, 272):
    S = torch.randn(2, 300, N, generator=g).cuda()
    q, tl = torch.tensor([300, 140]).cuda(), torch.tensor([N, 131]).cuda()
    for temp in (0.0, 1.0):
        _, state, best, failed = torch.ops.swcli.forward(S, q, tl, -1.0, temp, False, lane_columns=-1)
        torch.ops.swcli.backward(torch.ones(2).cuda(), S, state, best, failed, q, tl, -1.0, temp, False, lane_columns=-1)
# the soft search kernel: one query against blocks of one tile and of several (edge buffers), odd batches,
# a target of length 0, linear and affine, t = 1
from swcli.search import SoftSearch
for width, count in ((50, 9), (700, 33), (2100, 5)):
    targets = torch.randint(0, 24, (count, width), generator=g, dtype=torch.uint8).cuda()
    lengths = torch.randint(0, width + 1, (count,), generator=g).cuda(); lengths[0] = width; lengths[-1] = 0
    block = Block(targets, lengths, torch.zeros_like(lengths))
    query = torch.randint(0, 24, (45,), generator=g, dtype=torch.uint8).cuda()
    for gaps in ((-4.0, None, None), (None, -11.0, -1.0)):
        SoftSearch.of(B62, 1.0, *gaps).scores(query, block)
torch.cuda.synchronize(); print("small case done")
PY
      for tool in memcheck racecheck; do
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 240 compute-sanitizer --tool $tool --error-exitcode 3 python3 /tmp/small.py > "$OUT/sanitize_$tool.log" 2>&1
        echo "$tool: exit $? ; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tail -1)"
      done ;;
    profile)
      # the report comes back whole: read it here with the ncu_report wheel. For SASS, compile the .cu here
      # (nvcc -arch=sm_90 -cubin) and read it with the nvidia-cuda-cuobjdump / -nvdisasm wheels.
      timeout 240 ncu --clock-control none --set ${NCU_SET:-full} -k regex:"${NCU_KERNELS:-forward|codes|backward}" \
        -c ${NCU_COUNT:-4} -o "$OUT/kernels" python3 ${NCU_SCRIPT:-benchmarks/profile_workloads.py ${NCU_WORKLOAD:-kernels}} \
        > "$OUT/ncu.log" 2>&1; echo "ncu: exit $?" ;;
    clocks)
      # the SM clock, power and throttle reasons while the dense t=1 forward runs back to back for 6 s
      cat > /tmp/clocks.py <<'PY'
import subprocess, threading, time, torch, swcli
S = torch.randn(8192, 256, 256, device="cuda")
swcli.soft_smith_waterman(S, -1.0, 1.0); torch.cuda.synchronize()
samples, running = [], True
def sample():
    while running:
        samples.append(subprocess.run(["nvidia-smi", "--format=csv,noheader", "--query-gpu=clocks.sm,power.draw,"
                                       "temperature.gpu,clocks_throttle_reasons.active"], capture_output=True, text=True).stdout.strip())
        time.sleep(0.5)
thread = threading.Thread(target=sample); thread.start()
start, end, times, began = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True), [], time.time()
while time.time() - began < 6:
    start.record(); swcli.soft_smith_waterman(S, -1.0, 1.0); end.record(); end.synchronize()
    times.append(start.elapsed_time(end) * 1e3)
running = False; thread.join(); times.sort()
print(f"dense t=1 forward: median {times[len(times) // 2]:.1f} us over {len(times)} calls; SM clock, power, temperature, throttle reasons:")
print("\n".join(samples[2:8]))
PY
      python3 /tmp/clocks.py 2>&1 | tee "$OUT/clocks.txt" ;;
    steps)
      python3 benchmarks/profile_workloads.py steps 2>&1 | tee "$OUT/steps.txt" ;;
    host)
      python3 benchmarks/profile_workloads.py host 2>&1 | tee "$OUT/host.txt" ;;
    e2e)
      # swcli align on E2E_PAIRS (default 1,000,000) random pairs of the 250 proteins: the whole command
      # (wall time with start-up, peak RSS), then bench's end-to-end rows (in process, after a warm-up run)
      python3 - ${E2E_PAIRS:-1000000} <<'PY'
import random, sys
from Bio import SeqIO
records = list(SeqIO.parse(".bench/proteins.fasta", "fasta"))
rng = random.Random(0)
with open("/tmp/pairs.fasta", "w") as f:
    for k in range(int(sys.argv[1])):
        a, b = rng.choice(records), rng.choice(records)
        f.write(f">{a.id}\n{a.seq}\n>{b.id}\n{b.seq}\n")
PY
      ls -l /tmp/pairs.fasta
      for t in 1 0; do
        /usr/bin/time -v python3 -m swcli align /tmp/pairs.fasta --backend cuda --temperature $t -q -o /tmp/out_$t.tsv \
          2> "$OUT/e2e_$t.err"; echo "t=$t exit $?: $(grep -E 'Elapsed|Maximum resident' "$OUT/e2e_$t.err" | tr '\n' ' ')"
      done
      timeout 300 python3 -c "
from swcli.bench import end_to_end_rows; from swcli.fasta import read_fasta
rows = end_to_end_rows('cuda', list(read_fasta('$FASTA')), ${E2E_PAIRS:-1000000})
[print(r.workload, r.temperature, f'{r.seconds:.2f} s', f'{r.gcups:.1f} GCUPS', r.note) for r in rows]" 2>&1 | tee "$OUT/e2e.txt" ;;
    search)
      # make-db reads ../data/proteins.fasta beside itself: give it the same 250 proteins
      [ -f .peer/data/proteins.fasta ] || { mkdir -p .peer/data && cp $FASTA .peer/data/proteins.fasta; }
      started=$(date +%s)
      python3 .peer/tools/make-db /tmp/search_db.fasta && md5sum .peer/data/proteins.fasta /tmp/search_db.fasta \
        && echo "make-db: $(( $(date +%s) - started )) s" \
        && timeout 540 python3 benchmarks/search_peer.py .peer/cudasw4/allqueries.fasta /tmp/search_db.fasta \
             "$OUT/search" --work /tmp/search_work --peer .peer/peer-cudasw4 --gap-open ${GAP_OPEN:--4} \
             --gap-extend ${GAP_EXTEND:--4} 2>&1 | tee "$OUT/search_peer.txt" | tail -40
      echo "search: $(( $(date +%s) - started )) s" ;;
    search-sizes)
      [ -f .peer/data/proteins.fasta ] || { mkdir -p .peer/data && cp $FASTA .peer/data/proteins.fasta; }
      [ -f /tmp/search_db.fasta ] || python3 .peer/tools/make-db /tmp/search_db.fasta
      timeout 400 python3 benchmarks/search_blocks.py .peer/cudasw4/allqueries.fasta /tmp/search_db.fasta --gaps linear \
        --waves 1 --max-queries 1000 0 --max-cells 16777216 67108864 268435456 --soft-drops 24 40 2>&1 \
        | tee "$OUT/search_sizes.txt" ;;
    search-blocks)
      [ -f .peer/data/proteins.fasta ] || { mkdir -p .peer/data && cp $FASTA .peer/data/proteins.fasta; }
      [ -f /tmp/search_db.fasta ] || python3 .peer/tools/make-db /tmp/search_db.fasta
      for gaps in linear affine; do
        timeout 200 python3 benchmarks/search_blocks.py .peer/cudasw4/allqueries.fasta /tmp/search_db.fasta --gaps $gaps \
          --waves 1 2 --max-queries 1000 0 2>&1 | tee "$OUT/search_blocks_$gaps.txt"
      done ;;
    soft-search)
      for gaps in linear affine; do
        timeout 280 python3 benchmarks/search_soft.py $FASTA --gaps $gaps --json "$OUT/search_soft_$gaps.json" 2>&1 \
          | tee "$OUT/search_soft_$gaps.txt" | tail -32
      done ;;
    details)
      [ -f .peer/data/proteins.fasta ] || { mkdir -p .peer/data && cp $FASTA .peer/data/proteins.fasta; }
      [ -f /tmp/search_db.fasta ] || python3 .peer/tools/make-db /tmp/search_db.fasta
      for t in 0 1; do
        timeout 280 python3 benchmarks/details_speed.py .peer/cudasw4/allqueries.fasta /tmp/search_db.fasta --backend cuda \
          --repeats 3 --gap-open ${GAP_OPEN:--11} --gap-extend ${GAP_EXTEND:--1} -t $t 2>&1 | tee "$OUT/details_t$t.txt" | tail -9
      done ;;
    dist-overhead)
      [ -f .peer/data/proteins.fasta ] || { mkdir -p .peer/data && cp $FASTA .peer/data/proteins.fasta; }
      [ -f /tmp/search_db.fasta ] || python3 .peer/tools/make-db /tmp/search_db.fasta || exit 1
      [ -d /tmp/search_db ] || python3 -m swcli makedb /tmp/search_db.fasta /tmp/search_db || exit 1
      timeout 540 python3 benchmarks/distributed_overhead.py .peer/cudasw4/allqueries.fasta /tmp/search_db \
        --backend cuda --repeats ${DIST_REPEATS:-3} --query-copies ${DIST_QUERY_COPIES:-20} --work /tmp/dist_work 2>&1 \
        | tee "$OUT/dist_overhead.txt" | tail -12
      python3 -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/distributed_exchange.py --device cuda \
        2>&1 | tee -a "$OUT/dist_overhead.txt" | tail -1 ;;
    dist-scale)
      [ -f .peer/data/proteins.fasta ] || { mkdir -p .peer/data && cp $FASTA .peer/data/proteins.fasta; }
      [ -f /tmp/search_db800.fasta ] || python3 .peer/tools/make-db /tmp/search_db800.fasta 800 || exit 1
      timeout 580 python3 benchmarks/distributed_scaling.py .peer/cudasw4/allqueries.fasta /tmp/search_db800.fasta \
        "$OUT/scaling" --ranks "$(nvidia-smi -L | wc -l)" --repeats ${SCALE_REPEATS:-3} \
        --query-copies ${SCALE_QUERY_COPIES:-1} --work /tmp/dist_scaling 2>&1 | tee "$OUT/dist_scaling.txt" | tail -16 ;;
    *)
      echo "unknown stage $stage; see the stages at the top of $0" >&2; exit 2 ;;
  esac
done
echo "=== done $(date +%T)"
