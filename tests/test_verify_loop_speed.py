"""This project's DFlash decode beside z-lab's reference `dflash_generate` (github.com/z-lab/dflash, `dflash/model.py`,
read at 44947fbf): on the same draft and prompts both give greedy's tokens and accept alike, step for step, so the
timings of `runs/verify_loop_speed` compare the same work. Needs a z-lab checkout named by $ZLAB_DFLASH; skipped without."""
import os
from collections import Counter
from pathlib import Path

import pytest
from _scripts import load_script

ZLAB = os.environ.get("ZLAB_DFLASH", "")
BENCH = Path(__file__).resolve().parents[1] / "runs" / "verify_loop_speed" / "bench.py"
pytestmark = pytest.mark.skipif(not (Path(ZLAB) / "dflash" / "model.py").is_file() if ZLAB else True,
                                reason="no z-lab/dflash checkout: set ZLAB_DFLASH to one (git clone https://github.com/z-lab/dflash)")


def _bench():
    return load_script(BENCH, "verify_loop_bench")


def _zlab_hist(acceptance_lengths, steps: int, block_size: int) -> list[int]:
    "z-lab's per-step commit counts as our `accept_hist`, over its first `steps` steps (it may run one step past the cut)."
    counts = Counter(acceptance_lengths[:steps])
    return [counts.get(k, 0) for k in range(block_size + 1)]


def test_same_tokens_and_acceptance_as_zlab():
    from domino_research.decode import greedy_generate, speculative_generate
    bench = _bench()
    zm = bench.zlab_module(ZLAB)
    target, draft, prompts, stops = bench.load(6)
    zdraft = bench.zlab_draft(zm, draft)
    bs, accepted = draft.dflash.block_size, 0
    for ids in prompts:
        ours, st = speculative_generate(target, draft, ids, 64, stops, use_head=False)
        z = zm.dflash_generate(zdraft, target, ids, 64, stops, 0.0, block_size=bs, return_stats=True)
        assert ours == greedy_generate(target, ids, 64, stops) == z.output_ids[0, ids.shape[1]:].tolist()
        assert st["accept_hist"] == _zlab_hist(z.acceptance_lengths, st["verify_steps"], bs)
        accepted += st["committed"] - st["verify_steps"]
    assert accepted > 0                                       # proposals were accepted: the comparison is not vacuous


def test_acceptance_check_tells_another_decode_apart():
    "The same check on a decode that proposes otherwise (the Domino head on, which z-lab's loop never runs) must fail."
    from domino_research.decode import speculative_generate
    bench = _bench()
    zm = bench.zlab_module(ZLAB)
    target, draft, prompts, stops = bench.load(6)
    zdraft, bs = bench.zlab_draft(zm, draft), draft.dflash.block_size
    differs = 0
    for ids in prompts:
        _, st = speculative_generate(target, draft, ids, 64, stops, use_head=True)
        z = zm.dflash_generate(zdraft, target, ids, 64, stops, 0.0, block_size=bs, return_stats=True)
        differs += st["accept_hist"] != _zlab_hist(z.acceptance_lengths, st["verify_steps"], bs)
    assert differs > 0
