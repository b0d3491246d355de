"""Run by tests/test_shard.py under `torchrun` (2 ranks): several short trainings in one launch, with the target sharded
(`shard_target`: each rank reads only the rows it keeps), each with the draft replicated (DDP) or sharded (`shard_draft`),
some resumed from another's checkpoint, one against the target loaded whole. Each rank writes, per run, its result, the
target's fingerprint and the bytes it holds: the target's parameters once loaded, after its first forward and after the
first optimiser step, and the draft's parameters, gradients and AdamW state at that step.

A run with `"force_bf16": true` shards the draft with the CUDA recipe's bf16 `MixedPrecisionPolicy` (bf16 compute
parameters, fp32 gradient reduction, the forward under autocast) although the CPU accelerator's mixed precision is
"no": the same `shard_draft` code, handed an accelerator that says bf16 and autocasts on the CPU. It records the dtype
a draft layer's weights have during its forward."""
import json, sys, warnings
from pathlib import Path
from types import SimpleNamespace

import torch

from domino_research.shard import Parallel, shard_draft
from domino_research.train import TrainDominoRecipe, load_train_config


def storage_bytes(tensors) -> int:
    "Bytes of the distinct storages behind `tensors` (a DTensor counts its local shard): what is allocated, not viewed."
    seen = {}
    for t in tensors:
        if t is None: continue
        t = t.to_local() if hasattr(t, "to_local") else t
        s = t.untyped_storage()
        seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
    return sum(seen.values())


def fsdp_held(module):
    """The storages FSDP2 keeps for `module`'s units besides the registered parameters: each parameter's sharded data
    and its unsharded copy (freed storage counts 0). Private attributes, read defensively: absent ones add nothing."""
    for m in module.modules():
        group = getattr(getattr(m, "_get_fsdp_state", lambda: None)(), "_fsdp_param_group", None)
        for fp in getattr(group, "fsdp_params", []):
            yield getattr(fp, "_sharded_param_data", None)
            yield getattr(fp, "_unsharded_param", None)


def resident(module) -> int:
    return storage_bytes([*module.parameters(), *fsdp_held(module)])


class MeasuredParallel(Parallel):
    "The recipe's parallelism helper, recording what the draft holds and (`force_bf16`) sharding with bf16 compute."
    recipe = None

    def shard_draft(self, trainer, layers):
        r = self.recipe
        if not r.force_bf16: return super().shard_draft(trainer, layers)
        bf16 = SimpleNamespace(mixed_precision="bf16", autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
        shard_draft(trainer, layers, bf16)
        def record(mlp, args): r.bytes.setdefault("compute_dtype", str(mlp.down_proj.weight.dtype))   # returns None
        r.draft.layers[0].mlp.register_forward_pre_hook(record)

    def clip_grad_norm(self, model, max_norm):
        self.recipe.bytes.setdefault("draft_grads", storage_bytes(p.grad for p in model.parameters()))
        return super().clip_grad_norm(model, max_norm)


class Measured(TrainDominoRecipe):
    force_bf16 = False

    @property
    def parallel_class(self): return type("Parallel", (MeasuredParallel,), {"recipe": self})

    def _load_target(self):
        with warnings.catch_warnings(record=True) as caught:     # the whole-then-shard fallback warns: it must not happen
            warnings.simplefilter("always")
            target = super()._load_target()
        self.bytes["target_after_load"] = resident(target)
        self.bytes["target_loaded_whole"] = any("loads the target whole" in str(w.message) for w in caught)
        return target

    def _features(self, batch):
        feats = super()._features(batch)
        self.bytes.setdefault("target_after_forward", resident(self.target))
        return feats

    def _train_window(self, window, step):
        stats = super()._train_window(window, step)
        if "target_after_step" not in self.bytes:
            self.bytes["target_after_step"] = resident(self.target)
            self.bytes["draft_params"] = resident(self.trainer)
            self.bytes["optimizer_state"] = storage_bytes(v for s in self.optimizer.state.values() for v in s.values()
                                                          if torch.is_tensor(v))
        return stats


config, out_dir = sys.argv[1], Path(sys.argv[2])
runs = json.loads(sys.argv[3])          # [[run_name, {overrides}], ...], in order
results, recipe = {}, None
for name, overrides in runs:
    force_bf16 = overrides.pop("force_bf16", False)
    recipe = Measured(load_train_config(config, run_name=name, **overrides))
    recipe.bytes, recipe.force_bf16 = {}, force_bf16
    recipe.setup()
    result = recipe.run()
    results[name] = {"result": result, "bytes": recipe.bytes, "world": recipe.accelerator.num_processes,
                     "target_fingerprint": recipe.target_fingerprint}
    recipe.lock and recipe.lock.release()
    recipe.accelerator.wait_for_everyone()
rank = recipe.accelerator.process_index
(out_dir / f"rank{rank}.json").write_text(json.dumps(results))
recipe.accelerator.wait_for_everyone()
recipe.close()
