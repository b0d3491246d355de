"""Run by tests/test_eagle3.py under `torchrun` (2 ranks): several short EAGLE-3 trainings in one launch, each with the
draft replicated (DDP) or sharded (`shard_draft`), some resumed from another's checkpoint; each rank writes its results."""
import json, sys
from pathlib import Path

from domino_research.train import TrainEagle3Recipe, load_train_config

config, out_dir = sys.argv[1], Path(sys.argv[2])
runs = json.loads(sys.argv[3])          # [[run_name, {overrides}], ...], in order
results, recipe = {}, None
for name, overrides in runs:
    recipe = TrainEagle3Recipe(load_train_config(config, run_name=name, **overrides))
    recipe.setup()
    results[name] = {"result": recipe.run(), "world": recipe.accelerator.num_processes}
    recipe.lock and recipe.lock.release()
    recipe.accelerator.wait_for_everyone()
rank = recipe.accelerator.process_index
(out_dir / f"rank{rank}.json").write_text(json.dumps(results))
recipe.accelerator.wait_for_everyone()
recipe.close()
