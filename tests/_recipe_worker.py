"""Run by tests under `torchrun` (or plain python): build a recipe from a YAML config, then `eval` or `train`; write
per-rank JSON. `jobs`: several of those, one after another in one launch (each recipe builds its own target, data and
draft; the process group is the launch's); `cli`: the training command line, each rank with its own output_dir; `stall`:
rank 1 never joins."""
import json, os, sys
from pathlib import Path

from domino_research.train import RECIPES, load_train_config

mode, config_path, out_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
if mode == "cli":     # the training command line itself; RANK_OUTPUT_DIRS gives each rank its own output_dir (node-local folders)
    from domino_research.train import cli
    cli(["--config", config_path, "--output_dir", os.environ["RANK_OUTPUT_DIRS"].split(",")[int(os.environ.get("RANK", 0))]])
    sys.exit(0)
if mode == "stall":   # rank 1 never reaches the first collective: rank 0 must give up after dist_timeout_minutes
    import time
    from domino_research.train import TrainDFlashRecipe
    if os.environ.get("RANK") == "1": TrainDFlashRecipe._claim_run_dir = lambda self: time.sleep(600)
    cfg, t0 = load_train_config(config_path), time.time()
    try: RECIPES[cfg.recipe](cfg).setup()
    except Exception as e:
        print(f"gave up after {time.time() - t0:.1f} s: {type(e).__name__}", flush=True)
        os._exit(3)
    os._exit(0)
if mode == "jobs":    # several evaluations and trainings in one launch, in order: [[name, "eval" | "train", config], ...]
    results, recipe = {}, None
    for name, job, path in json.loads(config_path):
        cfg = load_train_config(path)
        recipe = RECIPES[cfg.recipe](cfg).setup()
        results[name] = {"world": recipe.accelerator.num_processes, **(recipe.validate() if job == "eval" else recipe.run())}
        recipe.lock and recipe.lock.release()
        recipe.accelerator.wait_for_everyone()
    (out_dir / f"rank{recipe.accelerator.process_index}.json").write_text(json.dumps(results))
    recipe.accelerator.wait_for_everyone()
    recipe.close()
    sys.exit(0)
cfg = load_train_config(config_path)
recipe = RECIPES[cfg.recipe](cfg).setup()
rank = recipe.accelerator.process_index
if mode == "eval":
    result = recipe.validate()
elif mode == "train":
    result = recipe.run()
else:
    raise SystemExit(f"unknown mode {mode}")
(out_dir / f"rank{rank}.json").write_text(json.dumps({"world": recipe.accelerator.num_processes, **result}))
recipe.accelerator.wait_for_everyone()   # ranks meet before the group goes: a gloo peer gone first can abort the other
recipe.close()
