"""#3 experiment (not shipped): does more training data (stdlib functions WITHOUT docstrings, train modules only)
plus a 1000-step budget move held-out greedy accuracy toward 0.5? Same tokenizer, same held-out splits."""
import ast, json, sys, textwrap, time, torch
import domino_research.embedded as E
from transformers import AutoTokenizer, Qwen3ForCausalLM
torch.set_num_threads(2)
steps = int(sys.argv[1]); hidden = int(sys.argv[2]); layers = int(sys.argv[3]); extra = sys.argv[4] == "extra"
tok = AutoTokenizer.from_pretrained(E.embedded_target_path())
corp = {s: E.read_jsonl(E.corpus_path(E.EMBEDDED_DIR, s)) for s in E.SPLITS}
train_mods = {r["module"] for r in corp["train"]}
held = {r["module"] for s in ("validation", "test") for r in corp[s]}
assert not train_mods & held
rows = list(corp["train"])
if extra:
    seen = {E._norm(r["messages"][1]["content"]) for s in E.SPLITS for r in corp[s]}
    for name, path in E.stdlib_modules():
        if name not in train_mods: continue
        src = path.read_text(encoding="utf-8", errors="replace")
        try: tree = ast.parse(src)
        except SyntaxError: continue
        lines = src.splitlines(keepends=True)
        for node, cls in E._functions(tree):
            if ast.get_docstring(node): continue
            b0 = node.body[0]
            first = min([b0.lineno] + [d.lineno for d in getattr(b0, "decorator_list", [])])
            body = textwrap.dedent("".join(lines[first - 1:node.body[-1].end_lineno])).rstrip()
            if not body or body[0].isspace() or "\t" in body or not (30 <= len(body) <= 1500) or body.count("\n") >= 40: continue
            if E._norm(body) in seen: continue
            seen.add(E._norm(body))
            where = f"this method of class `{cls}` in module `{name}`" if cls else f"this function from module `{name}`"
            rows.append({"messages": [{"role": "user", "content": f"Write the body of {where}:\n{E.function_signature(node)}"},
                                      {"role": "assistant", "content": body}], "module": name, "name": node.name})
train = E.fit_rows(tok, rows, 512)
val = E.fit_rows(tok, corp["validation"], 512)
test = E.fit_rows(tok, corp["test"], 512)
print(f"train rows {len(train)} (shipped corpus {len(corp['train'])}), val {len(val)}, test {len(test)}", flush=True)
torch.manual_seed(0)
m = Qwen3ForCausalLM(E.target_config(tok, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=hidden // 32,
                                     intermediate_size=3 * hidden))
print(f"{sum(p.numel() for p in m.parameters())/1e6:.2f} M params", flush=True)
t0 = time.time()
hist = E.train_target(m, tok, train, val[:150], steps=steps, max_tokens=4096, lr=3e-3, eval_every=max(1, steps // 8),
                      log=lambda s: print(s, flush=True))
acc = E.assistant_accuracy(m, tok, test)
print(json.dumps({"steps": steps, "hidden": hidden, "layers": layers, "extra": extra, "train_rows": len(train),
                  "train_s": round(time.time() - t0), "test": acc}), flush=True)
