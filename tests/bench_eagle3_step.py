"""Time EAGLE-3 training steps (forward and backward of `Eagle3Trainer`, the draft of the study's EAGLE-3: MLP 1,665)
on micro-batches of 8 real rows of the embedded recipe's training chats (their token ids and loss masks; the target's
features are random, which changes no timing). Not a test (pytest does not collect it). Compare the trainer as it is
with `--dense` (every position through the MLP and the CE, the form before the MLP ran on active positions only):

    farm-bench -n 5 --timeout 900 --vs "sh -c 'exec python tests/bench_eagle3_step.py --dense >>/tmp/dense.txt 2>&1'" \
        -- sh -c 'exec python tests/bench_eagle3_step.py >>/tmp/active.txt 2>&1'
    grep "per step" /tmp/active.txt /tmp/dense.txt

It prints the share of positions each step computes, the loss of the first batch (the same in both forms, to float
rounding) and the seconds per step. On 2026-12-07 (2 cores, every other job paused; the first run of each file is
farm-bench's warm-up): 3.15 s against 3.86 s per step (medians of five runs), 0.82; whole processes, start-up and
tokenising included, 0.91 (farm-bench's median A/B wall); loss of the first batch 6.098086 in both."""
import argparse, random, time

import torch
from transformers import AutoConfig

from domino_research.data import collate_chat, read_jsonl, tokenize_chat
from domino_research.eagle3 import Eagle3DraftModel, Eagle3Trainer, eagle3_qwen3_config, ttt_hidden_states
from domino_research.embedded import embedded_dataset_path, embedded_target_path
from domino_research.loss import chunked_dual_ce
from domino_research.target import load_tokenizer

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--dense", action="store_true", help="every position through the MLP and the CE (the earlier form)")
p.add_argument("--steps", type=int, default=3)
a = p.parse_args()
torch.set_num_threads(1)
torch.manual_seed(0)
path = embedded_target_path()
tok, tcfg = load_tokenizer(str(path)), AutoConfig.from_pretrained(path)
rows = read_jsonl(embedded_dataset_path("train"))
random.Random(0).shuffle(rows)
batches = [collate_chat([tokenize_chat(tok, r["messages"], 512) for r in rows[8 * i: 8 * i + 8]], tok.pad_token_id)
           for i in range(a.steps)]
draft = Eagle3DraftModel(eagle3_qwen3_config(tcfg, block_size=8, intermediate_size=1665))
H, V = tcfg.hidden_size, tcfg.vocab_size
trainer = Eagle3Trainer(draft, torch.nn.Embedding(V, H), torch.nn.Linear(H, V, bias=False))


def dense_loss(b, feats):
    "The loss with every position through the layer and the CE."
    t = trainer.block_targets(b["input_ids"], b["loss_mask"])
    hs = ttt_hidden_states(draft, trainer.target_embed, b["input_ids"], feats, trainer.ttt_steps)
    ce = chunked_dual_ce(draft.logits_input(hs), trainer.target_lm_head.weight.detach(), t.labels, t.weights,
                         n_weighted=t.n_weighted)
    return ce["base_ce_sum"] / t.weights.sum()


seconds = []
for i, b in enumerate(batches):
    feats = torch.randn(*b["input_ids"].shape, 3 * H, generator=torch.Generator().manual_seed(i))
    if i == 0:
        t = trainer.block_targets(b["input_ids"], b["loss_mask"])
        print("positions computed per step:", [round(n / b["input_ids"].numel(), 3) for n in t.n_rows])
    t0 = time.perf_counter()
    loss = dense_loss(b, feats) if a.dense else trainer(b["input_ids"], b["loss_mask"], feats)["loss"]
    loss.backward()
    seconds.append(time.perf_counter() - t0)
    if i == 0: print(f"loss of the first batch {loss.item():.6f}")
print(f"{'dense' if a.dense else 'active positions'}: {sum(seconds) / len(seconds):.2f} s per step ({a.steps} steps)")
