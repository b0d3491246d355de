"""A short trial of the second embedded target's build (code -> docstring task), to size the full build before it runs.

    nice -n 10 python runs/ablations/study29/target2/trial.py [--out /tmp/study29_target2_trial] [--steps 20]

It runs the builder's corpus and tokenizer stages for the second target (complete: they take seconds), then times
`--steps` training steps of the second target's model and of the shipped target's model, one after the other and then
the first again, in this one process and thread, in CPU time (a loaded machine's waits left out); and it times the second
model's greedy regeneration of a few test prompts. It writes trial.json beside this file: the corpus, the
parameter counts, seconds per step of each model, the ratio, the projected full-build time (scaled from the shipped
build's measured 1802 s for 4000 steps and 442 s of regeneration, runs/embedded_target_4000/) and the projected bytes
the second target adds to the repository."""
import argparse, json, time
from pathlib import Path

import torch
from transformers import Qwen3ForCausalLM

from domino_research.data import read_jsonl
from domino_research.embedded import EMBEDDED_DIR, SPLITS, TARGET_DIR, corpus_path
from domino_research.embedded_build import build_embedded, chat_tokens, fit_rows, target_config, train_target
from domino_research.regenerate import meta_path, regenerate
from domino_research.target import load_tokenizer

HERE = Path(__file__).resolve().parent
# The second target: code -> docstring, a 1024-token vocabulary (prose), hidden 256 (the first: 128), 8 layers.
SECOND = dict(task="docstring", vocab_size=1024,
              model_kwargs=dict(hidden_size=256, intermediate_size=768, num_attention_heads=4, num_key_value_heads=2,
                                head_dim=64))
SHIPPED_BUILD = {"steps": 4000, "train_s": 1802.0, "regen_s": 442.4}   # runs/embedded_target_4000/build_log.txt
SEQ, MAX_TOKENS = 768, 4096
SUBSET = 1500                    # training chats per model for the step timing (length-grouped batches of <= 4096 tokens)


def time_steps(tok, rows, model_kwargs, steps: int) -> tuple[float, int, object]:
    """CPU seconds per optimiser step of a fresh model of this shape in the builder's own loop: the median over steps
    2.. of the process time between log lines (one thread: CPU time does not count the waits of a loaded machine)."""
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(target_config(tok, **model_kwargs))
    stamps = []
    train_target(model, tok, rows, steps=steps + 1, max_tokens=MAX_TOKENS, lr=3e-3, log_every=1,
                 log=lambda m: stamps.append(time.process_time()))
    per_step = sorted(b - a for a, b in zip(stamps[1:], stamps[2:]))   # stamps[0] ends step 1 (allocations, warm-up)
    return per_step[len(per_step) // 2], sum(p.numel() for p in model.parameters()), model


def answer_tokens(tok, rows) -> list[int]:
    return [len(tok(r["messages"][-1]["content"], add_special_tokens=False)["input_ids"]) for r in rows]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("/tmp/study29_target2_trial"))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--regen_prompts", type=int, default=16)
    a = p.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    build_embedded(a.out, corpus_source="stdlib", stages=("corpus", "tokenizer"), replace=True, log=print,
                   task=SECOND["task"], vocab_size=SECOND["vocab_size"])
    corpus_s = time.time() - t0
    tok2, tok1 = load_tokenizer(a.out / TARGET_DIR), load_tokenizer(EMBEDDED_DIR / TARGET_DIR)
    rows2 = {s: fit_rows(tok2, read_jsonl(corpus_path(a.out, s)), SEQ) for s in SPLITS}
    rows1 = fit_rows(tok1, read_jsonl(corpus_path(EMBEDDED_DIR, "train"))[:SUBSET], SEQ)   # timing needs no more
    train2 = rows2["train"][:SUBSET]
    tok_per_chat = {n: sum(len(chat_tokens(t, r["messages"])["input_ids"]) for r in rs) / len(rs)
                    for n, t, rs in (("first", tok1, rows1), ("second", tok2, train2))}
    s1a, n1, _ = time_steps(tok1, rows1, {}, a.steps)
    s2, n2, model2 = time_steps(tok2, train2, SECOND["model_kwargs"], a.steps)
    s1b, _, _ = time_steps(tok1, rows1, {}, a.steps)
    ratio = s2 / ((s1a + s1b) / 2)
    # regeneration: an untrained model runs to the cap, so this is seconds per generated token at this size
    model2.eval()
    prompts = [{"messages": r["messages"][:1]} for r in rows2["test"][: a.regen_prompts]]
    tmp = a.out / "regen_trial.jsonl"
    for f in (tmp, meta_path(tmp)): f.unlink(missing_ok=True)          # regenerate resumes a file it finds: start afresh
    c0 = time.process_time()
    st = regenerate(model2, tok2, prompts, tmp, max_new_tokens=64, batch_size=16)
    s_per_token = (time.process_time() - c0) / max(st["new_tokens"], 1)
    ref = {s: answer_tokens(tok2, rows2[s]) for s in SPLITS}
    regen_tokens = sum(min(n + 1, 256) for v in ref.values() for n in v)    # a target that answers like the reference
    corpus_bytes = {s: corpus_path(a.out, s).stat().st_size for s in SPLITS}
    data_bytes = {s: sum(len(json.dumps(r, ensure_ascii=False).encode()) + 1 for r in rows2[s]) for s in SPLITS}
    out = {
        "command": "nice -n 10 python runs/ablations/study29/target2/trial.py --steps %d" % a.steps,
        "settings": SECOND, "torch_threads": 1, "trial_steps": a.steps,
        "corpus_rows": {s: len(read_jsonl(corpus_path(a.out, s))) for s in SPLITS},
        "rows_fitting_seq_768": {s: len(v) for s, v in rows2.items()},
        "corpus_and_tokenizer_s": round(corpus_s, 1),
        "parameters": {"first": n1, "second": n2},
        "mean_tokens_per_training_chat": tok_per_chat, "timing_subset_chats": SUBSET,
        "epochs_per_1000_steps": {"first": 1000 * MAX_TOKENS / (tok_per_chat["first"] * 10364),   # its 10,364 chats
                                  "second": 1000 * MAX_TOKENS / (tok_per_chat["second"] * len(rows2["train"]))},
        "cpu_s_per_step": {"first_before": s1a, "second": s2, "first_after": s1b}, "step_ratio_second_to_first": ratio,
        "projected_train_s_per_1000_steps_idle": SHIPPED_BUILD["train_s"] / SHIPPED_BUILD["steps"] * 1000 * ratio,
        "regen_trial": {"prompts": len(prompts), "new_tokens": st["new_tokens"], "seconds": st["seconds"],
                        "cpu_s_per_token": s_per_token},
        "reference_answer_tokens": {s: {"rows": len(v), "median": sorted(v)[len(v) // 2], "sum": sum(v)} for s, v in ref.items()},
        "projected_regen_tokens": regen_tokens,
        "projected_regen_cpu_s": regen_tokens * s_per_token,
        "bytes": {"corpus_gz": corpus_bytes, "data_jsonl_estimate": data_bytes,
                  "tokenizer_json": (a.out / TARGET_DIR / "tokenizer.json").stat().st_size,
                  "model_bf16_estimate": 2 * n2},
    }
    out["bytes"]["total_estimate_without_train_log"] = (sum(corpus_bytes.values()) + sum(data_bytes.values())
                                                        + out["bytes"]["tokenizer_json"] + out["bytes"]["model_bf16_estimate"])
    (HERE / "trial.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
