"""This project's Domino decode beside SpecForge's Domino rollout (github.com/sgl-project/SpecForge,
`specforge/modeling/draft/{dflash,domino}.py`, read at a6b6b023): with the same draft weights both give greedy's tokens
and propose the same tokens at every verify step, so `runs/verify_loop_speed/specforge_bench.py` times the same work; and
ours keeps its lead. Needs a SpecForge source tree named by $SPECFORGE_SRC; skipped without."""
import os
from pathlib import Path

import pytest
from _scripts import load_script

SRC = os.environ.get("SPECFORGE_SRC", "")
BENCH = Path(__file__).resolve().parents[1] / "runs" / "verify_loop_speed" / "specforge_bench.py"
pytestmark = pytest.mark.skipif(not (SRC and (Path(SRC) / "specforge" / "modeling" / "draft" / "domino.py").is_file()),
                                reason="no SpecForge source tree: set SPECFORGE_SRC to one "
                                       "(git clone https://github.com/sgl-project/SpecForge)")


@pytest.fixture(scope="module")
def setup():
    bench = load_script(BENCH, "specforge_bench")
    sf_domino = bench.specforge_module(SRC)
    target, draft, prompts, stops = bench.load(4)
    return bench, sf_domino, target, draft, prompts, stops


@pytest.fixture(scope="module")
def reference(setup):
    "Greedy's and our decode's runs of the prompts (64 new tokens), shared by the checks below."
    bench, _, target, draft, prompts, stops = setup
    return [bench.run(impl, target, draft, None, prompts, stops, 64) for impl in ("greedy", "ours")]


def test_same_tokens_and_proposals_as_specforge(setup, reference):
    bench, sf_domino, target, draft, prompts, stops = setup
    sf = bench.specforge_draft(sf_domino, draft)
    theirs = bench.run("specforge", target, draft, sf, prompts, stops, 64)
    check = bench.check_equivalent(*reference, theirs)                         # raises on any difference
    assert check["verify_steps"] < reference[1]["tokens"] - len(prompts)      # proposals were accepted: not vacuous


def test_proposal_check_tells_a_shifted_head_apart(setup, reference):
    "SpecForge's head with its corrected slots starting one slot early (suffix_start 0, not 1) must fail both checks."
    bench, sf_domino, target, draft, prompts, stops = setup
    from domino_research.decode import draft_dflash_config
    sf = bench.specforge_draft(sf_domino, draft)
    sf.pure_draft_prefix_len = 0
    with pytest.raises(RuntimeError, match="suffix_start"): bench.check_same_head(sf, draft_dflash_config(draft))
    shifted = bench.run("specforge", target, draft, sf, prompts, stops, 64)
    with pytest.raises(AssertionError, match="proposals differ"): bench.check_equivalent(*reference, shifted)


def test_specforge_rereads_the_block_through_the_gru(setup):
    """Where SpecForge's extra time goes: per verify step its rollout runs the GRU over the whole block once per proposal,
    (bs-1)·bs token steps; ours carries the GRU state, bs-1 steps (the anchor and d_1, then one per corrected slot)."""
    bench, sf_domino, target, draft, prompts, stops = setup
    from domino_research.decode import speculative_generate
    sf = bench.specforge_draft(sf_domino, draft)
    bs, ours_reads, theirs_reads = draft.dflash.block_size, [0], [0]

    def count(reads, fn, steps_of):
        def call(x, *a, **kw):
            reads[0] += steps_of(x)
            return fn(x, *a, **kw)
        return call

    draft.head_step = count(ours_reads, draft.head_step, lambda e: e.shape[0])        # one token per call
    sf.prefix_gru.forward = count(theirs_reads, sf.prefix_gru.forward, lambda x: x.shape[1])
    try:
        _, st = speculative_generate(target, draft, prompts[0], 64, stops)
        _, n = bench.specforge_generate(sf, target, prompts[0], 64, stops)
    finally: del draft.head_step, sf.prefix_gru.forward
    assert ours_reads[0] == st["verify_steps"] * (bs - 1)
    assert theirs_reads[0] == n * (bs - 1) * bs


def _lead(setup, ours: str, theirs: str, rounds: int = 3) -> float:
    "CPU seconds of decode `theirs` over decode `ours` on the same prompts, each the minimum over alternating rounds."
    bench, sf_domino, target, draft, prompts, stops = setup
    sf, prompts = bench.specforge_draft(sf_domino, draft), prompts[:2]
    secs = [[], []]
    for _ in range(rounds):
        for side, impl in enumerate((ours, theirs)):
            secs[side].append(bench.run(impl, target, draft, sf, prompts, stops, 64)["seconds"])
    return min(secs[1]) / min(secs[0])


LEAD = 1.3   # measured about 2 on this CPU (runs/verify_loop_speed/README.md)


def test_domino_decode_leads_specforge(setup):
    "Same tokens, same proposals (above): ours decodes them at least 1.3x faster."
    lead = _lead(setup, "ours", "specforge")
    assert lead > LEAD, f"SpecForge's decode takes {lead:.2f}x our CPU time: the lead is gone"


def test_lead_check_fails_without_a_lead(setup):
    "The same check with SpecForge's decode on both sides, a decode with no lead, must fail."
    lead = _lead(setup, "specforge", "specforge")
    assert not lead > LEAD, f"SpecForge against itself reads {lead:.2f}x: the check cannot tell a lead from none"
