"""Side-by-side timing of this project's Domino decode and SpecForge's Domino rollout (`DFlashDraftModel.spec_generate`
inherited by `DominoDraftModel`, specforge/modeling/draft/{dflash,domino}.py), with the same Domino draft weights.

Both decode a kept Domino draft of study 28 (`shift_label: true`, GRU head, one pure slot) on the embedded target, study
28's evaluation prompts (64 test prompts, stratified sample, seed 0), at most 128 new tokens, greedy, one CPU thread.
SpecForge's code is imported from a source tree given by `--specforge` (or $SPECFORGE_SRC); it is never copied here.

    python runs/verify_loop_speed/specforge_bench.py [--prompts 64] [--new 128] [--repeat 3] [--breakdown]

times `--repeat` rounds of greedy, ours and SpecForge's, alternating, checks on the first that both decodes give greedy's
tokens and propose the same tokens at every verify step, and prints each round's CPU seconds and each decode's
efficiency (speed-up over greedy / tau), ours / SpecForge's, min / median / max over rounds. `--breakdown`: CPU ms per
verify step in the target's layers, the LM head, the draft backbone, the Domino head's rollout, and the loop itself.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import ROOT, LegacyCropCache, peer_config  # noqa: E402  (this folder's z-lab bench's helpers)

DOMINO = ROOT / "runs" / "ablations" / "study28" / "steps2880" / "runs" / "domino" / "seed0" / "draft_bf16"
SNAPSHOT = "a6b6b0230009d15ec2a97a57384e6f53f0f96946"   # the SpecForge commit these figures were measured at


def specforge_module(path: str):
    "SpecForge's `specforge.modeling.draft.domino`, from a source tree of github.com/sgl-project/SpecForge (None if absent)."
    if not path or not (Path(path) / "specforge" / "modeling" / "draft" / "domino.py").is_file(): return None
    sys.path.insert(0, str(path))
    import specforge.modeling.draft.dflash as sf_dflash
    import specforge.modeling.draft.domino as sf_domino
    sf_dflash.DynamicCache = LegacyCropCache     # its loop crops with transformers 4.x's `crop(n)`; nothing else changed
    return sf_domino


def specforge_state_dict(draft) -> dict:
    """Our draft's tensors under SpecForge's `DominoDraftModel` names. The mapping is the identity: notebook 31 writes
    SpecForge's layout (`layers.i.*`, `fc`, `hidden_norm`, `norm`, `prefix_gru.weight_{ih,hh}_l0`, `embed_proj.{0,2}`);
    `specforge_draft` checks that every one of SpecForge's tensors gets one of ours, of the same shape, and none is left."""
    return {name: t for name, t in draft.state_dict().items()}


def check_same_head(sf, d) -> None:
    "Raise if SpecForge's Domino head is parametrised otherwise than ours (`d`: our draft's DFlashConfig)."
    ours = dict(shift_label=d.shift_label, pure_draft_prefix_len=d.pure_draft_prefix_len, suffix_start=d.suffix_start,
                block_size=d.block_size, mask_token_id=d.mask_token_id, target_layer_ids=list(d.target_layer_ids),
                gru_hidden_dim=d.gru_hidden_dim, emb_dim=d.emb_dim, gru_bias=False, gru_layers=1)
    theirs = dict(shift_label=sf.shift_label, pure_draft_prefix_len=sf.pure_draft_prefix_len, suffix_start=sf.suffix_start,
                  block_size=sf.block_size, mask_token_id=sf.mask_token_id, target_layer_ids=list(sf.target_layer_ids),
                  gru_hidden_dim=sf.gru_hidden_dim, emb_dim=sf.emb_dim, gru_bias=sf.prefix_gru.bias,
                  gru_layers=sf.prefix_gru.num_layers)
    diff = {k: (ours[k], theirs[k]) for k in ours if ours[k] != theirs[k]}
    if diff: raise RuntimeError(f"SpecForge's Domino head differs from ours (ours, theirs): {diff}")


def specforge_draft(sf_domino, draft):
    "SpecForge's `DominoDraftModel` holding `draft`'s tensors (backbone and head), in `draft`'s dtype."
    from domino_research.decode import draft_dflash_config
    m = sf_domino.DominoDraftModel(peer_config(draft)).eval()
    sd = specforge_state_dict(draft)
    want = m.state_dict()
    shapes = {k: (tuple(sd[k].shape), tuple(want[k].shape)) for k in sd.keys() & want.keys() if sd[k].shape != want[k].shape}
    missing, unexpected = m.load_state_dict(sd, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected or shapes:
        raise RuntimeError(f"SpecForge draft: missing {missing}, left over {unexpected}, shapes (ours, theirs) {shapes}")
    check_same_head(m, draft_dflash_config(draft))
    return m.to(next(draft.parameters()).dtype)


def load(n_prompts: int, draft_dir: Path = DOMINO, seed: int = 0):
    """The embedded target, the draft in fp32 (SpecForge feeds the target's fp32 features to the draft uncast; bf16 ->
    fp32 is exact), study 28's evaluation prompts (`sample_prompts`: stratified by module, `seed`), the stop ids."""
    from domino_research.data import stop_token_ids
    from domino_research.embedded import embedded_dataset_path, load_embedded_target
    from domino_research.evaluation import encode_prompt, read_prompts, sample_prompts
    from domino_research.export import load_draft
    target, tok = load_embedded_target()
    sample = sample_prompts(read_prompts(embedded_dataset_path("test")), n_prompts, seed=seed)
    prompts = [encode_prompt(tok, r["messages"]) for r in sample]
    return target, load_draft(draft_dir, dtype=torch.float32), prompts, stop_token_ids(tok, target)


def ours_proposals(target, draft, ids, new: int, stops) -> tuple[list[int], list[list[int]]]:
    "Our Domino decode (head on, whole vocabulary) of one prompt: its tokens and the proposals of every verify step."
    from domino_research.decode import DraftProposer, check_draft_fits, speculative_loop
    d = check_draft_fits(draft, target)
    propose, steps = DraftProposer(draft, target, d), []

    def recorded(*args):
        steps.append(propose(*args))
        return steps[-1]

    out, _ = speculative_loop(target, recorded, ids, new, d.block_size, d.target_layer_ids, stops)
    return out, steps


def specforge_generate(sf, target, ids, new: int, stops, record: list | None = None) -> tuple[list[int], int]:
    "SpecForge's greedy `spec_generate` of one prompt: its new tokens and its verify steps; `record`: gets each step's proposals."
    calls, wrapped = [0], sf.__dict__.get("_sample_draft_tokens")   # (a wrapper `breakdown` put there, kept inside)
    inner = sf._sample_draft_tokens

    def counted(*args):
        calls[0] += 1
        props = inner(*args)
        if record is not None: record.append(props[0].tolist())
        return props

    sf._sample_draft_tokens = counted                 # the instance's: SpecForge's method, counted
    try: out = sf.spec_generate(target, ids, new, stops, 0.0)
    finally:
        if wrapped is None: del sf._sample_draft_tokens
        else: sf._sample_draft_tokens = wrapped
    return out[0, ids.shape[1]:].tolist(), calls[0]


def run(impl: str, target, draft, sf, prompts, stops, new: int) -> dict:
    """Decode every prompt with `impl` (greedy, ours, specforge): CPU seconds (prefill included, loading not), new tokens
    and verify steps summed, and per prompt the tokens and each verify step's proposals (recording them costs a list
    append per step, the same in both decodes)."""
    from domino_research.decode import greedy_generate
    secs, outs, props = 0.0, [], []
    for ids in prompts:
        steps = []
        t0 = time.process_time()
        if impl == "ours": out, steps = ours_proposals(target, draft, ids, new, stops)
        elif impl == "specforge": out, _ = specforge_generate(sf, target, ids, new, stops, steps)
        else: out = greedy_generate(target, ids, new, stops)
        secs += time.process_time() - t0
        outs.append(out)
        props.append(steps)
    return dict(impl=impl, seconds=secs, tokens=sum(map(len, outs)), steps=sum(map(len, props)), outputs=outs,
                proposals=props)


def check_equivalent(greedy: dict, ours: dict, theirs: dict) -> dict:
    """Runs of the same prompts: both decodes give greedy's tokens, and at every verify step before ours stops both
    propose the same tokens (so they accept alike). SpecForge may run one step more at the token cut (its loop stops on
    positions, ours on tokens)."""
    for i, (g, o, t) in enumerate(zip(greedy["outputs"], ours["outputs"], theirs["outputs"])):
        if not o == t == g: raise AssertionError(f"prompt {i}: a decode is not greedy's tokens")
    extra = 0
    for i, (o, t) in enumerate(zip(ours["proposals"], theirs["proposals"])):
        if t[: len(o)] != o or len(t) - len(o) not in (0, 1):
            first = next((k for k, (a, b) in enumerate(zip(o, t)) if a != b), min(len(o), len(t)))
            raise AssertionError(f"prompt {i}: proposals differ at verify step {first} ({len(o)} steps ours, "
                                 f"{len(t)} SpecForge's)")
        extra += len(t) - len(o)
    return dict(prompts=len(ours["outputs"]), verify_steps=ours["steps"], specforge_extra_steps=extra)


def summary(res: dict, n_prompts: int) -> dict:
    """tau = tokens after the prefill's first per verify step; efficiency = (greedy seconds / spec seconds) / tau per
    round; ours / SpecForge's per round; min, median, max over rounds."""
    tau = {i: (res[i][0]["tokens"] - n_prompts) / res[i][0]["steps"] for i in ("ours", "specforge")}
    eff = {i: [g["seconds"] / r["seconds"] / tau[i] for r, g in zip(res[i], res["greedy"])] for i in tau}
    ratio = [o / s for o, s in zip(eff["ours"], eff["specforge"])]
    time_ratio = [s["seconds"] / o["seconds"] for o, s in zip(res["ours"], res["specforge"])]
    mmm = lambda xs: [round(min(xs), 4), round(statistics.median(xs), 4), round(max(xs), 4)]
    return dict(tau={k: round(v, 4) for k, v in tau.items()}, eff_ours=mmm(eff["ours"]), eff_specforge=mmm(eff["specforge"]),
                eff_ratio=mmm(ratio), eff_ratio_rounds=[round(x, 4) for x in ratio],
                time_specforge_over_ours=mmm(time_ratio), speedup_ours=mmm([e * tau["ours"] for e in eff["ours"]]),
                speedup_specforge=mmm([e * tau["specforge"] for e in eff["specforge"]]))


class ExclusiveTimer:
    "CPU seconds spent inside named calls, each exclusive of the named calls it makes (so the parts add up)."
    def __init__(self): self.spent, self._stack = {}, []

    def wrap(self, name: str, fn):
        def call(*args, **kw):
            self._stack.append(0.0)
            t0 = time.process_time()
            try: return fn(*args, **kw)
            finally:
                took, inner = time.process_time() - t0, self._stack.pop()
                self.spent[name] = self.spent.get(name, 0.0) + took - inner
                if self._stack: self._stack[-1] += took
        return call


def breakdown(impl: str, target, draft, sf, prompts, stops, new: int) -> dict:
    """CPU ms per verify step in the target's decoder layers, its LM head (verify and the draft's base logits), the draft
    backbone, the Domino head's rollout (ours: `domino_rollout`; SpecForge's: `_sample_draft_tokens`, less its LM-head
    call), and the rest: the loop itself (prefills included)."""
    import domino_research.decode as dec
    t = ExclusiveTimer()
    mods = {"target layers": target.model, "lm_head": target.lm_head, "draft backbone": sf if impl == "specforge" else draft}
    for name, m in mods.items(): m.forward = t.wrap(name, m.forward)
    rollout = dec.domino_rollout
    if impl == "ours": dec.domino_rollout = t.wrap("head rollout", rollout)
    else: sf._sample_draft_tokens = t.wrap("head rollout", sf._sample_draft_tokens)
    try: r = run(impl, target, draft, sf, prompts, stops, new)
    finally:
        for m in mods.values(): del m.forward                    # the class's forward again
        dec.domino_rollout = rollout
        sf.__dict__.pop("_sample_draft_tokens", None)
    ms = {k: round(v / r["steps"] * 1e3, 3) for k, v in t.spent.items()}
    return dict(impl=impl, verify_steps=r["steps"], total_ms_per_step=round(r["seconds"] / r["steps"] * 1e3, 3), **ms,
                rest=round((r["seconds"] - sum(t.spent.values())) / r["steps"] * 1e3, 3))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--draft", type=Path, default=DOMINO, help="a Domino draft folder (default: study 28's domino seed 0)")
    ap.add_argument("--breakdown", action="store_true", help="per verify step: where the time goes, ours and SpecForge's")
    ap.add_argument("--specforge", default=os.environ.get("SPECFORGE_SRC", ""))
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    sf_domino = specforge_module(a.specforge)
    if sf_domino is None:
        sys.exit(f"--specforge {a.specforge!r}: no SpecForge source tree there (git clone "
                 f"https://github.com/sgl-project/SpecForge; git checkout {SNAPSHOT[:8]}), or set SPECFORGE_SRC")
    target, draft, prompts, stops = load(a.prompts, a.draft)
    sf = specforge_draft(sf_domino, draft)
    if a.breakdown:
        for i in ("ours", "specforge"): print(json.dumps(breakdown(i, target, draft, sf, prompts, stops, a.new)))
        return
    res = {i: [] for i in ("greedy", "ours", "specforge")}
    for k in range(a.repeat):                        # rounds alternate the three; each round's line as it ends
        for i, rs in res.items(): rs.append(run(i, target, draft, sf, prompts, stops, a.new))
        if k == 0: print(json.dumps(dict(check=check_equivalent(*(rs[0] for rs in res.values())))), flush=True)
        print(json.dumps({i: dict(seconds=round(rs[-1]["seconds"], 3), tokens=rs[-1]["tokens"], steps=rs[-1]["steps"])
                          for i, rs in res.items()}), flush=True)
    print(json.dumps(summary(res, len(prompts))), flush=True)


if __name__ == "__main__":
    main()
