"""Real-size stages: (A) corpus copy + tokenizer (vocab 384) + 4 target steps from the shipped corpus;
(B) regenerate + quality with the shipped target on a copy of the shipped assets (4 rows a split, 32 new tokens)."""
import sys, time, importlib, shutil, torch
from pathlib import Path
torch.set_num_threads(1)
modname, out = sys.argv[1], Path(sys.argv[2])
if len(sys.argv) > 3: sys.path.insert(0, sys.argv[3])
m = importlib.import_module(modname)
from domino_research.embedded import EMBEDDED_DIR
t0 = time.time()
m.build_embedded(out / "A", steps=4, stages=("corpus", "tokenizer", "target"), log=lambda s: None)
shutil.copytree(EMBEDDED_DIR, out / "B", ignore=shutil.ignore_patterns("data", "MANIFEST.json", "quality.json"))
q = m.build_embedded(out / "B", max_new_tokens=32, max_regen_rows=4, stages=("regenerate", "quality"), log=lambda s: None)
print(f"{modname}: {time.time()-t0:.1f} s", q)
