"""The second target's acceptance check: how many of a build's regenerated (greedy) answers loop, by the builder's own
measure, on the splits that are regenerated so far.

    python runs/ablations/study29/target2/loops.py <build folder> [test validation ...]

It reads `<build>/data/<split>.jsonl` (written by `embedded_build --stages regenerate`, test first) and prints one JSON
line per split: `embedded_build.response_stats` at `max_new_tokens` 256, the cap the builds regenerate with. A build is
shipped only if fewer than 10 % of its test answers loop (README, § The second target)."""
import argparse, json
from pathlib import Path

from domino_research.data import read_jsonl
from domino_research.embedded import dataset_path
from domino_research.embedded_build import response_stats
from domino_research.target import load_tokenizer

MAX_NEW_TOKENS = 256    # the builds' regeneration cap: an answer this long was cut, not finished

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("build", type=Path)
    p.add_argument("splits", nargs="*", default=["test"])
    a = p.parse_args()
    tok = load_tokenizer(str(a.build / "target"))
    for split in a.splits:
        path = dataset_path(a.build, split)
        if not path.is_file(): raise SystemExit(f"{path}: not regenerated yet (embedded_build --stages regenerate)")
        s = response_stats(tok, read_jsonl(path), MAX_NEW_TOKENS)
        print(json.dumps({"split": split} | {k: round(v, 4) if isinstance(v, float) else v for k, v in s.items()}))
