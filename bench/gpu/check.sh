#!/usr/bin/env bash
# The CUDA check on a lent GPU machine (docs/benchmarks.md, CUDA): install the carried
# TorchRec/FBGEMM set (bench/gpu/wheels.sh; the first call left fb.part00 in /tmp/gp), then
#   1. smoke.py: versions, FBGEMM CUDA ops, gloo collectives on CUDA tensors;
#   2. the 2D-vs-1D equivalence tests (tests/test_core_collection.py) with every rank on the GPU;
#   3. the trainer on CUDA + NCCL (one process: one GPU), and the same job on CPU + gloo;
#   4. with FT_ROUNDS set: bench/ft_bench.py --clean-only on the machine's CPU cores (gloo),
#      fault tolerance vs the standard launcher where each worker has a core of its own;
#   5. more distributed test modules on the GPU, for what breaks there.
# Logs go to $OUT. Each step has its own time limit so one hang costs only that step.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
SITE=/tmp/site
step() { echo "== $(date +%T) $*"; }
step install
if [[ ! -d $SITE/fbgemm_gpu ]]; then
  mkdir -p $SITE
  cat /tmp/gp/fb.part00 .gpu/fb.part01 | xz -d -T0 | tar -C $SITE -xf - || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE .gpu/*.whl || exit 1
  tar -C $SITE -xzf .gpu/pure.tgz || exit 1
fi
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
if [[ -z ${SKIP_SMOKE:-} ]]; then
  step smoke
  timeout 150 python3 bench/gpu/smoke.py 2>&1 | tail -20 | tee "$OUT/smoke.log"
fi
step equivalence  # a hung check fails after CHECK_S, each hung rank printing its stack here (-s)
SPARSE2D_TEST_DEVICE=cuda SPARSE2D_TEST_CHECK_S=${CHECK_S:-45} timeout ${EQ_S:-200} \
  python3 -m pytest -v -s -p no:cacheprovider --timeout=${TEST_S:-120} --tb=short -rfE \
  tests/test_core_collection.py --durations=5 -W ignore \
  2>&1 | tee "$OUT/equivalence.log" | tail -60
step trainer
for dev in ${TRAIN_DEVICES:-cuda cpu}; do
  timeout ${TRAIN_S:-100} env NPROC=1 MAX_RESTARTS=0 PYTHON=python3 launch/local.sh device=$dev \
    parallel.sharding_group_size=1 train.steps=${STEPS:-300} train.eval_every=150 \
    run_dir=/tmp/run_$dev > "$OUT/train_$dev.log" 2>&1
  echo "trainer $dev rc=$?"; tail -6 "$OUT/train_$dev.log"
done
if [[ -n ${FT_ROUNDS:-} ]]; then
  step "ft-bench cpu, $(nproc) cores"
  timeout ${FT_S:-240} python3 bench/ft_bench.py --clean-only --pipeline sparse_dist \
    --steps ${FT_STEPS:-1000} --rounds "$FT_ROUNDS" --out "$OUT/ft" --no-results-md \
    > "$OUT/ft_bench.log" 2>&1
  echo "ft-bench rc=$?"; tail -15 "$OUT/ft_bench.log"
fi
[[ -n ${SKIP_MORE:-} ]] && exit 0
step more
SPARSE2D_TEST_DEVICE=cuda SPARSE2D_TEST_CHECK_S=${CHECK_S:-45} timeout ${MORE_S:-120} python3 -m pytest -q -p no:cacheprovider -W ignore \
  tests/test_sync_ddp_fold.py tests/test_sync_ddp_carried_vote.py tests/test_sync_guard.py \
  tests/test_checkpoint.py tests/test_checkpoint_integrity.py tests/test_core_group_refs.py \
  2>&1 | tee "$OUT/more.log" | tail -40  # MC modules need TorchRec >= 1.7 (1.6.1 is carried)
step done
