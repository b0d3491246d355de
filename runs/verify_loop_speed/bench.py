"""Side-by-side timing of this project's DFlash decode and z-lab's reference `dflash_generate` (dflash/model.py).

Both run the same DFlash-convention draft (the backbone of `runs/serving/served_domino`, `shift_label: false`, the
block z-lab reads: slots 1..bs-1) on the embedded target, the same held-out test prompts, greedy, one CPU thread.
z-lab's code is imported from a checkout given by `--zlab` (or $ZLAB_DFLASH); it is never copied here.

    python runs/verify_loop_speed/bench.py --impl ours|zlab|ours_greedy|zlab_greedy [--prompts 20] [--new 128]

prints one JSON line: the decode's CPU seconds (prefill included, model loading not), tokens, target forwards. `--impl
all` (the default) runs the four in turn, `--repeat` rounds, checks every output is greedy's, and prints each decode's
efficiency (speed-up over its own greedy / tau, tau = tokens per target forward) and ours / z-lab's, per round and
median. `--breakdown`: milliseconds per verify step in the target's layers, the LM head, the draft, and the loop itself.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

ROOT = Path(__file__).resolve().parents[2]
DRAFT = ROOT / "runs" / "serving" / "served_domino" / "draft"


class LegacyCropCache(DynamicCache):
    """The peers' loops (z-lab's, SpecForge's) were written for transformers 4.x, where `crop(n)` keeps the first n
    positions; transformers 5 takes -removed."""
    def crop(self, max_length: int):
        if max_length < 0: return super().crop(max_length)
        cur = self.get_seq_length()
        if max_length < cur: super().crop(max_length - cur)


def zlab_module(path: str):
    "z-lab's `dflash.model`, from a checkout of github.com/z-lab/dflash (None when absent)."
    if not path or not (Path(path) / "dflash" / "model.py").is_file(): return None
    sys.path.insert(0, str(path))
    import dflash.model as zm

    zm.DynamicCache = LegacyCropCache
    zm._cuda_time = time.perf_counter                   # its stats clock syncs CUDA; on the CPU it is the plain clock
    return zm


def peer_config(draft):
    """A copy of `draft`'s config for a peer's draft class. The current export writes `initializer_range: -1` so that a
    plain AutoModel load stops (notebook 31); a peer's constructor draws initial weights with it (the loaded tensors
    replace them), so it gets a valid one."""
    cfg = type(draft.config).from_dict(draft.config.to_dict())
    cfg._attn_implementation = draft.config._attn_implementation
    if getattr(cfg, "initializer_range", 0.02) < 0: cfg.initializer_range = 0.02
    return cfg


def zlab_draft(zm, draft):
    "z-lab's DFlashDraftModel holding `draft`'s backbone weights (the same tensors, the Domino head left out)."
    cfg = peer_config(draft)
    m = zm.DFlashDraftModel(cfg).eval()
    missing, _ = m.load_state_dict(draft.state_dict(), strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing: raise RuntimeError(f"z-lab draft: weights missing from ours: {missing}")
    return m.to(next(draft.parameters()).dtype)


def load(n_prompts: int, draft_dir: Path = DRAFT):
    "The embedded target, the draft at `draft_dir` in fp32, the first `n_prompts` test prompts (chat template), the stops."
    from domino_research.data import stop_token_ids
    from domino_research.embedded import embedded_dataset_path, load_embedded_target
    from domino_research.export import load_draft
    target, tok = load_embedded_target()
    rows = embedded_dataset_path("test").read_text().splitlines()[:n_prompts]
    prompts = []
    for line in rows:
        ids = tok.apply_chat_template(json.loads(line)["messages"][:-1], add_generation_prompt=True,
                                      enable_thinking=False, return_tensors="pt")
        prompts.append(ids if torch.is_tensor(ids) else ids["input_ids"])
    # fp32 like the target: z-lab feeds the target features to the draft uncast
    return target, load_draft(draft_dir, dtype=torch.float32), prompts, stop_token_ids(tok, target)


def run(impl: str, target, draft, zdraft, zm, prompts, stops, new: int) -> dict:
    "Decode every prompt with `impl`; the seconds, tokens and verify steps summed over prompts, and the outputs."
    from domino_research.decode import greedy_generate, speculative_generate
    secs, toks, steps, outs = 0.0, 0, 0, []
    for ids in prompts:
        t0 = time.process_time()
        if impl == "ours":
            out, st = speculative_generate(target, draft, ids, new, stops, use_head=False)
            steps += st["verify_steps"] + 1                      # + the prefill's token, as z-lab counts it
        elif impl == "ours_greedy":
            out = greedy_generate(target, ids, new, stops)
        else:
            bs = 1 if impl == "zlab_greedy" else draft.dflash.block_size
            r = zm.dflash_generate(zdraft, target, ids, new, stops, 0.0, block_size=bs, return_stats=True)
            out = r.output_ids[0, ids.shape[1]:].tolist()
            steps += len(r.acceptance_lengths) + 1              # verify steps + the prefill's token
        secs += time.process_time() - t0
        toks += len(out)
        outs.append(out)
    return dict(impl=impl, seconds=secs, tokens=toks, steps=steps, outputs=outs)


def breakdown(impl: str, target, draft, zdraft, zm, prompts, stops, new: int) -> dict:
    """Milliseconds per verify step (CPU time) in the target's decoder layers, its LM head (verify and draft logits), the
    draft backbone, and the rest (the loop itself: cache crops, feature capture, block building, acceptance)."""
    parts = {"target layers": target.model, "lm_head": target.lm_head, "draft": zdraft if impl == "zlab" else draft}
    spent = dict.fromkeys(parts, 0.0)

    def timed(name, fwd):
        def call(*args, **kw):
            t0 = time.process_time()
            try: return fwd(*args, **kw)
            finally: spent[name] += time.process_time() - t0
        return call

    for name, m in parts.items(): m.forward = timed(name, m.forward)
    try: r = run(impl, target, draft, zdraft, zm, prompts, stops, new)
    finally:
        for m in parts.values(): del m.forward                 # the class's forward again
    steps = r["steps"] - len(prompts)                           # verify steps (the prefills are counted in full)
    ms = {k: round(v / steps * 1e3, 3) for k, v in spent.items()}
    return dict(impl=impl, verify_steps=steps, total_ms_per_step=round(r["seconds"] / steps * 1e3, 3), **ms,
                rest=round((r["seconds"] - sum(spent.values())) / steps * 1e3, 3))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", default="all", choices=["ours", "zlab", "ours_greedy", "zlab_greedy", "all"])
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--breakdown", action="store_true", help="per verify step: where the time goes, ours and z-lab's")
    ap.add_argument("--zlab", default=os.environ.get("ZLAB_DFLASH", ""))
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    zm = zlab_module(a.zlab)
    if zm is None and (a.impl.startswith("zlab") or a.impl == "all" or a.breakdown):
        sys.exit(f"--zlab {a.zlab!r}: no z-lab/dflash checkout there (git clone https://github.com/z-lab/dflash)")
    target, draft, prompts, stops = load(a.prompts)
    zdraft = zlab_draft(zm, draft) if zm is not None else None
    if a.breakdown:
        for i in ("ours", "zlab"): print(json.dumps(breakdown(i, target, draft, zdraft, zm, prompts, stops, a.new)))
        return
    # no grad mode set here: each decode runs under the one it sets itself, as a user calls it
    impls = ["ours", "zlab", "ours_greedy", "zlab_greedy"] if a.impl == "all" else [a.impl]
    res = {i: [] for i in impls}
    for _ in range(a.repeat if a.impl == "all" else 1):
        for i in impls: res[i].append(run(i, target, draft, zdraft, zm, prompts, stops, a.new))
    for i, rs in res.items():
        print(json.dumps(dict(impl=i, seconds=[round(r["seconds"], 3) for r in rs], tokens=rs[0]["tokens"],
                              steps=rs[0]["steps"])))
    if a.impl == "all":
        ref = res["ours_greedy"][0]["outputs"]
        for i in impls: assert res[i][0]["outputs"] == ref, f"{i}: not greedy's tokens"
        print(json.dumps(summary(res)))


def summary(res: dict) -> dict:
    "Per repeat: tau, each decode's efficiency (speed-up over its own greedy / tau) and ours / z-lab's (median over repeats)."
    import statistics
    tau = {i: res[i][0]["tokens"] / res[i][0]["steps"] for i in ("ours", "zlab")}
    eff = {i: [g["seconds"] / r["seconds"] / tau[i] for r, g in zip(res[i], res[f"{i}_greedy"])] for i in ("ours", "zlab")}
    ratio = [o / z for o, z in zip(eff["ours"], eff["zlab"])]
    same_greedy = [z["seconds"] / o["seconds"] for o, z in zip(res["ours"], res["zlab"])]   # = ratio on one baseline
    med = lambda xs: round(statistics.median(xs), 4)
    return dict(tau=tau, eff_ours=med(eff["ours"]), eff_zlab=med(eff["zlab"]), eff_ratio=med(ratio),
                eff_ratio_all=[round(x, 4) for x in ratio], spec_time_ratio_zlab_over_ours=med(same_greedy))


if __name__ == "__main__":
    main()
