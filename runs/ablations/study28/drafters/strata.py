"""The prompt-only stratification, fixed from the prompts alone before any decode of this folder is read.

    python runs/ablations/study28/drafters/strata.py      # -> prompt_strata.json

Each test prompt's score is the repetition inside the prompt (`data.prompt_repetition`, notebook 11: the share of the
prompt's tokens inside a 4-gram that occurred earlier in the prompt). The cut points are the terciles of that score
over the 303 test prompts (`data.tercile_cuts`: `numpy.quantile` at 1/3 and 2/3, linear interpolation); a prompt's
third is how many cut points its score is at or above (`data.stratum`).
"""
import json
from pathlib import Path

import numpy as np

from domino_research.data import prompt_repetition, stratum, tercile_cuts
from domino_research.embedded import load_embedded_target

HERE = Path(__file__).parent


def main():
    from decode import test_prompts                     # the same prompts, in the same order, as the decodes
    _, tok = load_embedded_target()
    recs, prompts = test_prompts(tok)
    scores = [prompt_repetition(p[0].tolist()) for p in prompts]
    cuts = tercile_cuts(scores)
    third = [stratum(s, cuts) for s in scores]
    out = dict(score="repetition_score([], prompt_ids): share of the prompt's tokens inside a 4-gram seen earlier in it",
               cut_points=cuts, n_per_third=np.bincount(third, minlength=3).tolist(),
               per_prompt=[dict(prompt_id=r["id"], prompt_score=float(s), third=int(t))
                           for r, s, t in zip(recs, scores, third)])
    (HERE / "prompt_strata.json").write_text(json.dumps(out, indent=1) + "\n")
    print("cut points", cuts, "prompts per third", out["n_per_third"])


if __name__ == "__main__":
    main()
