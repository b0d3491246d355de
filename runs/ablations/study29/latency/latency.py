"""Study 29, piece 12: the draft step and the target's verify step timed at Qwen3-8B's shapes, and each drafter's
speed-up projected from them (README.md beside this file: the formula and its assumptions).

    nice -n 19 python runs/ablations/study29/latency/latency.py --eagle3_block_size 16   # the real run (EAGLE-3's chosen block)
    python runs/ablations/study29/latency/latency.py --tiny --out /tmp/lat.json # tiny shapes, seconds (the test's)

One thread, random weights (weights do not change timings), real tensors. The target is never built whole: verify steps
are timed with 2 and 4 decoder layers (and 6, the check), and a straight line t(L) = intercept + slope * L carries them to
the real target's layer count. The drafters are the decoder's own (`build_drafter`) over drafts built by the project's
builders from the shipped Qwen3-8B recipes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from domino_research.build import build_draft
from domino_research.decode import StepTimer, kv_heads_shared, build_drafter, crop_cache
from domino_research.train_config import load_train_config

QWEN3_8B = Path(__file__).resolve().parents[4] / "domino_research/assets/qwen3_8b/config.json"
RECIPES = {"domino": "qwen3_8b_domino", "dflash": "qwen3_8b_dflash", "eagle3": "qwen3_8b_eagle3"}
# --tiny: Qwen3-8B's layer count and recipes at tiny widths (seconds; its timings mean nothing, the test runs it)
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            vocab_size=1024, bos_token_id=0, eos_token_id=1)
TINY_RECIPE = dict(emb_dim=16, gru_hidden_dim=32)               # the Domino head at tiny widths


# ---- the straight line: what the test pins -------------------------------------------------------------------------
def fit_line(layers: list[int], seconds: list[float]) -> tuple[float, float]:
    "(intercept, slope) of the least-squares line seconds = intercept + slope * layers (two points: the line through them)."
    if len(set(layers)) < 2: raise ValueError(f"need timings at two or more layer counts to fit a line, got {layers}")
    mx, my = statistics.fmean(layers), statistics.fmean(seconds)
    slope = sum((x - mx) * (y - my) for x, y in zip(layers, seconds)) / sum((x - mx) ** 2 for x in layers)
    return my - slope * mx, slope


def at_layers(line: tuple[float, float], n_layers: int) -> float:
    "The line's seconds at `n_layers` decoder layers."
    return line[0] + line[1] * n_layers


def projection(t_plain: float, t_draft: float, t_verify: float) -> dict:
    """speed-up = τ · t_plain / (t_draft + t_verify): `per_tau` is the factor τ multiplies, `break_even_tau` the τ at
    which speculative decoding only ties plain decoding (one target forward per token)."""
    per_tau = t_plain / (t_draft + t_verify)
    return dict(per_tau=per_tau, break_even_tau=1 / per_tau, draft_over_verify=t_draft / t_verify)


# ---- timing ---------------------------------------------------------------------------------------------------------
def median_seconds(step, reps: int, warmup: int = 1, clock=time.perf_counter) -> float:
    "Median wall-clock seconds of `step()` over `reps` runs after `warmup` untimed ones."
    for _ in range(warmup): step()
    times = []
    for _ in range(reps):
        t0 = clock()
        step()
        times.append(clock() - t0)
    return statistics.median(times)


def target_config(n_layers: int, tiny: bool) -> Qwen3Config:
    "Qwen3-8B's config (tiny widths with `tiny`) with `n_layers` decoder layers; sdpa attention, as the decoder runs it."
    raw = json.loads(QWEN3_8B.read_text())
    raw.update(TINY if tiny else {}, num_hidden_layers=n_layers, max_window_layers=n_layers)
    cfg = Qwen3Config(**{k: v for k, v in raw.items() if k not in ("architectures", "transformers_version")})
    cfg._attn_implementation = "sdpa"
    return cfg


def random_target(n_layers: int, tiny: bool, dtype: torch.dtype) -> Qwen3ForCausalLM:
    "A random-weight Qwen3 causal LM with `n_layers` decoder layers, in `dtype`, eval mode."
    torch.manual_seed(0)
    with torch.device("cpu"):
        torch.set_default_dtype(dtype)                          # built in dtype: no fp32 copy of an 8B-wide layer first
        try: model = Qwen3ForCausalLM(target_config(n_layers, tiny))
        finally: torch.set_default_dtype(torch.float32)
    return model.eval()


@torch.inference_mode()
def context_cache(target, context: int):
    "The target's KV cache after a prefill of `context` random tokens: the verify steps' context."
    cache = DynamicCache(config=target.config)
    target(input_ids=torch.randint(target.config.vocab_size, (1, context)), cache=cache, use_cache=True, logits_to_keep=1)
    return cache


@torch.inference_mode()
def verify_seconds(target, cache, block: int, reps: int, clock=time.perf_counter) -> float:
    """Median seconds of the decoder's verify step: one forward of `block` tokens right after the context held in `cache`,
    logits for every block position (as `speculative_loop` computes them); the cache is cropped back after each step."""
    context = cache.get_seq_length()
    ids = torch.randint(target.config.vocab_size, (1, block))
    pos = torch.arange(context, context + block)[None]

    def step():
        with kv_heads_shared(ids.device):                      # the decoder's CPU verify: SDPA shares the KV heads
            target(input_ids=ids, position_ids=pos, cache=cache, use_cache=True)
        crop_cache(cache, context)                              # back to the context: every step sees the same cache
    return median_seconds(step, reps, clock=clock)


class DraftTarget(nn.Module):
    """What a drafter reads of its target: the real target's config (all its layers, for the layer ids a draft fuses) and
    the embedding and LM head of the random target (the same tensors; the decoder layers are never needed)."""
    def __init__(self, config, target):
        super().__init__()
        self.config, self.embed, self.head = config, target.get_input_embeddings(), target.get_output_embeddings()
    def get_input_embeddings(self): return self.embed
    def get_output_embeddings(self): return self.head


def recipe_draft(recipe: str, full_config, tiny: bool, dtype: torch.dtype) -> nn.Module:
    "The draft the shipped Qwen3-8B `recipe` trains, built by `build_draft`, random weights, in `dtype`."
    over = dict(attention_backend="sdpa",                       # the CPU decoder's attention (the recipe's flex is CUDA's)
                train_data="unread.jsonl")                      # the recipe requires one; building a draft reads none
    if tiny: over |= dict(mask_token_id=full_config.vocab_size - 1)
    if tiny and recipe == "domino": over |= TINY_RECIPE
    cfg = load_train_config(RECIPES[recipe], **over)
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)
    try: draft = build_draft(cfg, full_config)
    finally: torch.set_default_dtype(torch.float32)
    return draft.eval()


@torch.inference_mode()
def draft_seconds(drafter, hidden: int, context: int, new: int, reps: int, timer: StepTimer | None = None,
                  clock=time.perf_counter) -> float:
    """Median seconds of one draft step in the steady state: the draft's cache holds `context` positions and the step
    adds the target features of the `new` positions the last verify accepted (lookup: its proposal over the tokens)."""
    L = max(len(drafter.layer_ids), 1)
    tokens = torch.randint(1000, (context + new + 1,)).tolist()
    if drafter.layer_ids:                                       # fill the draft's cache with the context's features
        drafter(torch.randn(1, context, L * hidden), tokens[context], context, tokens)
        _crop_draft(drafter, context)
    ctx = torch.randn(1, new, L * hidden)
    start = context + new
    if timer is not None: timer.seconds.clear()                 # the sections of the timed steps (and the warm-up) only

    def step():
        drafter(ctx, tokens[start], start, tokens[: start + 1])
        if drafter.layer_ids: _crop_draft(drafter, context)
    return median_seconds(step, reps, clock=clock)


def _crop_draft(drafter, length: int):
    "Back to `length` cached positions (a DFlash/Domino draft's DynamicCache or EAGLE-3's own cache)."
    if hasattr(drafter.cache, "crop") and not hasattr(drafter.cache, "get_seq_length"): drafter.cache.crop(length)
    else: crop_cache(drafter.cache, length)


CHECK_TOLERANCE = 0.10        # a line more than 10 % off a measured layer count is flagged: identical layers cost alike


def _check(fit: float, measured: float) -> dict:
    "The line's value at a measured layer count beside the measurement, and how far off it is (relative)."
    return dict(fit=fit, measured=measured, rel_err=fit / measured - 1)


# ---- the run --------------------------------------------------------------------------------------------------------
def run(args) -> dict:
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    full = target_config(json.loads(QWEN3_8B.read_text())["num_hidden_layers"], args.tiny)
    T, res = full.num_hidden_layers, dict(args=vars(args), params={}, verify={}, draft={}, lines={},
                                     projection={})
    blocks = sorted({1, *args.blocks})
    for n in args.layers + args.check_layers:
        target = random_target(n, args.tiny, dtype)
        cache = context_cache(target, args.context)
        res["params"][str(n)] = sum(p.numel() for p in target.parameters())   # (a memory-bound step reads them all)
        for b in blocks:
            res["verify"].setdefault(str(b), {})[str(n)] = verify_seconds(target, cache, b, args.reps)
            print(f"verify  layers {n}  block {b:3d}: {res['verify'][str(b)][str(n)] * 1e3:9.2f} ms", flush=True)
        if n == args.layers[0]:                                  # drafters borrow this target's embedding and LM head
            stand_in = DraftTarget(full, target)
            for name in args.drafters:
                spec = dict(drafter="lookup") if name == "lookup" else dict(drafter="eagle3" if name == "eagle3" else "draft")
                if name == "eagle3": spec |= dict(block_size=args.eagle3_block_size)   # None: the recipe's chain
                draft = None if name == "lookup" else recipe_draft(name, full, args.tiny, dtype)
                timer = StepTimer()                             # the drafter's own sections (draft, Domino's rollout)
                d = build_drafter(spec, stand_in, draft=draft, timer=timer)
                res["draft"][name] = dict(seconds=draft_seconds(d, full.hidden_size, args.context, args.new, args.reps,
                                                                timer=timer), block_size=d.block_size,
                                          params=0 if draft is None else sum(p.numel() for p in draft.parameters()),
                                          sections={k: v / (args.reps + 1) for k, v in timer.seconds.items()})
                print(f"draft   {name:7s} block {d.block_size:3d}: {res['draft'][name]['seconds'] * 1e3:9.2f} ms", flush=True)
                del d, draft
            del stand_in
        del target, cache                                       # freed before the next (larger) target is built
    for b in blocks:
        line = fit_line(args.layers, [res["verify"][str(b)][str(n)] for n in args.layers])
        res["lines"][str(b)] = dict(intercept=line[0], slope=line[1], projected={str(T): at_layers(line, T)},
                                    check={str(n): _check(at_layers(line, n), res["verify"][str(b)][str(n)])
                                           for n in args.check_layers})
        for n, c in res["lines"][str(b)]["check"].items():
            flag = "" if abs(c["rel_err"]) <= CHECK_TOLERANCE else "  <- off the line: a busy machine? rerun on a quiet one"
            print(f"check   layers {n}  block {b:3d}: line {c['fit'] * 1e3:9.2f} ms, measured {c['measured'] * 1e3:9.2f} ms "
                  f"({c['rel_err']:+.1%}){flag}", flush=True)
    t_plain = res["lines"]["1"]["projected"][str(T)]
    for name, d in res["draft"].items():
        t_verify = at_layers((res["lines"][str(d["block_size"])]["intercept"], res["lines"][str(d["block_size"])]["slope"]), T)
        proj = res["projection"][name] = dict(t_draft=d["seconds"], t_verify=t_verify, t_plain=t_plain,
                                              **projection(t_plain, d["seconds"], t_verify))
        if name in args.tau: proj |= dict(tau=args.tau[name], speed_up=args.tau[name] * proj["per_tau"])
        print(f"project {name:7s}: speed-up = τ × {res['projection'][name]['per_tau']:.3f} "
              f"(break-even τ {res['projection'][name]['break_even_tau']:.2f})", flush=True)
    return res


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="tiny widths (seconds): the test's mode")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--layers", type=int, nargs="+", default=[2, 4, 6, 8],
                   help="layer counts the line is fitted to (least squares; 2 and 4 alone missed a 6-layer check by 10 %%)")
    p.add_argument("--check_layers", type=int, nargs="*", default=[12], help="layer counts measured to check the line")
    p.add_argument("--blocks", type=int, nargs="+", default=[8, 16], help="verify widths besides 1 (EAGLE-3 8, drafts 16)")
    p.add_argument("--drafters", nargs="+", default=["domino", "dflash", "eagle3", "lookup"])
    p.add_argument("--eagle3_block_size", type=int, default=None,
                   help="EAGLE-3's verify width (its chain of proposals + 1) where a study chose one; the recipe's otherwise. "
                        "Add it to --blocks")
    p.add_argument("--context", type=int, default=512, help="tokens in the KV cache before the step")
    p.add_argument("--new", type=int, default=4, help="positions the last verify accepted (the draft step's new features)")
    p.add_argument("--reps", type=int, default=9,
                   help="timed repetitions per step (the median is kept; 5 missed the 12-layer check twice on 2026-12-07)")
    p.add_argument("--tau", nargs="*", default=[], metavar="DRAFTER=TAU",
                   help="a measured τ per drafter (e.g. domino=2.65): its projected speed-up is written beside the factor")
    p.add_argument("--out", default=str(Path(__file__).with_name("latency.json")))
    args = p.parse_args(argv)
    if any(n < 1 for n in args.layers + args.check_layers): p.error("--layers/--check_layers: layer counts must be >= 1")
    if args.eagle3_block_size is not None and args.eagle3_block_size not in args.blocks:
        p.error(f"--eagle3_block_size {args.eagle3_block_size}: its verify is not timed; add it to --blocks")
    if args.eagle3_block_size is not None and "eagle3" not in args.drafters:
        p.error("--eagle3_block_size sets EAGLE-3's chain, but eagle3 is not in --drafters: add it or drop the option")
    args.tau = dict(_tau(p, t) for t in args.tau)
    return args


def _tau(p, text: str) -> tuple[str, float]:
    "('domino', 2.65) from 'domino=2.65'; a one-line usage error otherwise."
    name, _, value = text.partition("=")
    try: tau = float(value)
    except ValueError: tau = float("nan")
    if not name or not tau >= 1: p.error(f"--tau {text!r}: write DRAFTER=TAU with τ >= 1 (tokens per verify), e.g. domino=2.65")
    return name, tau


def main(argv=None):
    args = parse(argv)
    res = run(args)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
