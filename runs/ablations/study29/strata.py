"""Study 29's strata, fixed before any decoding: each test prompt's repetition inside the prompt (`data.prompt_repetition`,
on the chat-template ids the decoder sees) and the terciles of those scores over every test prompt of a target.

    python runs/ablations/study29/strata.py                       # the shipped target -> strata_embedded.json
    python runs/ablations/study29/strata.py --build DIR --name N  # another build folder (the second target) -> strata_N.json

It refuses to overwrite a cut-point file: the cut points are frozen once written (README.md says when)."""
import argparse, json
from collections import Counter
from pathlib import Path

from domino_research.data import prompt_repetition, stratum, tercile_cuts
from domino_research.embedded import EMBEDDED_DIR, dataset_path, embedded_target_path, sha256_file
from domino_research.evaluation import encode_prompt, read_prompts
from domino_research.target import load_tokenizer

STUDY = Path(__file__).resolve().parent
ROOT = STUDY.parents[2]                                   # the repository


def _shown(path: Path) -> str:
    "A path relative to the repository when it lies inside it (the file stays the same on another clone)."
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def prompt_strata(records: list[dict], tokenizer) -> tuple[list[float], list[dict]]:
    "The cut points (terciles of the prompt-only scores of `records`) and each prompt's index, id, score and stratum."
    scores = [prompt_repetition(encode_prompt(tokenizer, r["messages"])[0].tolist()) for r in records]
    cuts = tercile_cuts(scores)
    return cuts, [{"index": r["index"], "id": r["id"], "score": s, "stratum": stratum(s, cuts)} for r, s in zip(records, scores)]


def strata(build: Path, split: str = "test") -> dict:
    "Every prompt of `split` with its prompt-only score and stratum, and the cut points (terciles over them all)."
    src = dataset_path(build, split)
    cuts, prompts = prompt_strata(read_prompts(src), load_tokenizer(embedded_target_path(build)))
    return {"score": "data.prompt_repetition(encode_prompt(tokenizer, messages)[0]), n=4", "split": split,
            "source": _shown(src),
            "source_sha256": sha256_file(src), "n_prompts": len(prompts), "cuts": cuts,
            "counts": [Counter(p["stratum"] for p in prompts)[k] for k in range(3)], "prompts": prompts}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", type=Path, default=EMBEDDED_DIR, help="a build folder (default: the shipped target)")
    p.add_argument("--name", default="embedded", help="the target's name in the output file strata_<name>.json")
    a = p.parse_args()
    out = STUDY / f"strata_{a.name}.json"
    if out.exists(): raise SystemExit(f"{out} exists: its cut points are frozen; write another --name, or delete it on purpose")
    res = strata(a.build)
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"{out}: {res['n_prompts']} prompts, cuts {[round(c, 4) for c in res['cuts']]}, strata sizes {res['counts']}")
