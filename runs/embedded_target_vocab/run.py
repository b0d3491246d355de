"""Issue 3: short (500-step) comparisons of the target's vocabulary, learning rate and loss span, on the corpus with
undocumented training functions. Test accuracy/CE over the test rows that fit 512 tokens with each tokenizer."""
import ast, json, sys, textwrap, time, math, argparse, torch
import domino_research.embedded as E
from transformers import AutoTokenizer, Qwen3ForCausalLM
import os; torch.set_num_threads(int(os.environ.get("THREADS", 2)))
ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=250); ap.add_argument("--vocab", type=int, default=1024)
ap.add_argument("--lr", type=float, default=3e-3); ap.add_argument("--max_tokens", type=int, default=4096)
ap.add_argument("--hidden", type=int, default=128); ap.add_argument("--layers", type=int, default=8)
ap.add_argument("--bf16", type=int, default=1); ap.add_argument("--save", default="")
ap.add_argument("--asst_only", type=int, default=0)
a = ap.parse_args()
if a.asst_only:
    class L(list): start = 0
    _orig_ids, _orig_col = E.chat_ids, E.collate_padded
    def chat_ids(tok, messages):
        ids = L(_orig_ids(tok, messages))
        ids.start = len(tok.apply_chat_template(messages[:-1], tokenize=True, add_generation_prompt=True, enable_thinking=False, return_dict=False))
        return ids
    def collate_padded(seqs, pad_id):
        enc = _orig_col(seqs, pad_id)
        for b, s in enumerate(seqs):
            enc["labels"][b, :getattr(s, "start", 0)] = -100
        return enc
    E.chat_ids, E.collate_padded = chat_ids, collate_padded
corp = E.build_corpus(n_test=330, n_validation=330, seed=0)  # the shipped corpus: documented + undocumented train rows
rows = corp["train"]
if True:
    tok = E.train_tokenizer(E.tokenizer_texts(corp["train"]), a.vocab)
train = E.fit_rows(tok, rows, 512)
test = E.fit_rows(tok, corp["test"], 512)
val = E.fit_rows(tok, corp["validation"], 512)
ntrain_tok = sum(len(E.chat_ids(tok, r["messages"])) for r in train)
print(f"vocab {len(tok)} train rows {len(train)} tokens {ntrain_tok} test {len(test)}", flush=True)
torch.manual_seed(0)
m = Qwen3ForCausalLM(E.target_config(tok, hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.hidden // 32,
                                     intermediate_size=3 * a.hidden))
t0 = time.time()
with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(a.bf16)):
    hist = E.train_target(m, tok, train, val[:150], steps=a.steps, max_tokens=a.max_tokens, lr=a.lr, eval_every=max(1, a.steps // 4),
                          log=lambda s: None)
train_s = time.time() - t0
m.float()
acc = E.assistant_accuracy(m, tok, test)
nbytes = sum(len((r["messages"][1]["content"]).encode()) for r in test)
bpb = acc["ce"] * acc["tokens"] / math.log(2) / nbytes
print(json.dumps({**vars(a), "train_s": round(train_s), "test_acc": round(acc["accuracy"], 4), "test_ce": round(acc["ce"], 3),
                  "bits_per_byte": round(bpb, 4), "bytes_per_tok": round(nbytes / acc["tokens"], 3),
                  "val": [round(h["val_accuracy"], 3) for h in hist if "val_accuracy" in h]}), flush=True)
if a.save: m.save_pretrained(a.save); tok.save_pretrained(a.save)
