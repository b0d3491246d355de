#!/bin/bash
# Two 200-step Domino runs on the embedded default: one after the other with 2 threads each, then both at once with 1 thread each.
cd "$(dirname "$0")/../.."
O=/tmp/jobs_timing; rm -rf $O/s0 $O/s1 $O/p0 $O/p1; mkdir -p $O
run() { .venv/bin/python -m domino_research.train --config embedded_domino --max_steps 200 --output_dir $O --run_name $1 --seed $2 \
  --decode_eval_prompts 0 --eval_every_steps null --save_every_steps null --data_cache_dir $O/.cache > $O/$1.log 2>&1; }
TQDM_DISABLE=1 OMP_NUM_THREADS=2 run warm 0   # builds the data cache (not timed)
t0=$(date +%s.%N)
TQDM_DISABLE=1 OMP_NUM_THREADS=2 run s0 0; TQDM_DISABLE=1 OMP_NUM_THREADS=2 run s1 1
t1=$(date +%s.%N)
(TQDM_DISABLE=1 OMP_NUM_THREADS=1 run p0 0 &) ; TQDM_DISABLE=1 OMP_NUM_THREADS=1 run p1 1; wait
while pgrep -f "run_name p0" > /dev/null; do sleep 0.5; done
t2=$(date +%s.%N)
python3 -c "s=$t1-$t0; p=$t2-$t1; print(f'serial 2 threads: {s:.1f} s, parallel 1 thread each: {p:.1f} s, ratio {s/p:.2f}')"
