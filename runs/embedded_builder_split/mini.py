"Run the notebook's miniature build (section 8 arguments) with a given builder module into a given folder."
import sys, time, importlib, torch
from pathlib import Path
torch.set_num_threads(1)
modname, out = sys.argv[1], Path(sys.argv[2])
if len(sys.argv) > 3: sys.path.insert(0, sys.argv[3])
m = importlib.import_module(modname)
_mods = ["textwrap", "shlex", "fnmatch", "colorsys", "bisect", "glob", "keyword", "copy"]
t0 = time.time()
q = m.build_embedded(out, corpus_source="stdlib", modules=_mods, n_test=6, n_validation=6, vocab_size=300,
                     model_kwargs=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                       head_dim=16, intermediate_size=64),
                     steps=int(__import__("os").environ.get("STEPS", 5)), max_tokens=2048, max_new_tokens=int(__import__("os").environ.get("NEW", 8)), regen_batch_size=4, max_regen_rows=3, log=lambda s: None)
print(f"{modname}: {time.time()-t0:.1f} s", q)
