"""No idle GPU time: an optimiser step of the embedded recipe makes the host wait for the GPU at most twice, and the
recipe builds AdamW with the kernel that suits the device (fused on CUDA). Counted on the CPU with `HostSyncs`
(notebook 06), which sees every scalar read, value-sized op and copy to the host a GPU run would wait on."""
import unittest.mock

import pytest
import torch

from domino_research.reduce import HostSyncs
from domino_research.train import RECIPES
from domino_research.train_config import load_train_config


def _recipe(tmp_path, name="embedded_domino", recipe_class=None, **kw):
    cfg = load_train_config(name, run_name="syncs", output_dir=str(tmp_path / "runs"), data_cache_dir=str(tmp_path / "cache"),
                            n_eval_prompts=0, eval_data=None, max_train_samples=64, **kw)
    return (recipe_class or RECIPES[cfg.recipe])(cfg).setup()


def _window_syncs(r) -> HostSyncs:
    """Host syncs of the second optimiser step (the first creates AdamW's state). Host-side preparation is not counted:
    it must see only batches that have not been copied to the device."""
    r.trainer.train()
    windows = r._epoch_windows(0, 0)
    assert r._train_window(next(windows)[0], 0) is not None
    opt = getattr(r.optimizer, "optimizer", r.optimizer)
    host_steps = [s["step"] for s in opt.state.values()]     # AdamW's step counters live on the host, even on CUDA
    hs, moved = HostSyncs(ignore=host_steps), set()
    to_device, prepare = r._to_device, r._prepare_on_host
    def tracked_to_device(b):
        out = to_device(b)
        moved.add(id(out))
        return out
    def uncounted_prepare(b):
        assert id(b) not in moved, "host-side preparation ran on a batch already on the device"
        with hs.paused(): return prepare(b)
    with unittest.mock.patch.object(r, "_to_device", tracked_to_device), \
            unittest.mock.patch.object(r, "_prepare_on_host", uncounted_prepare), hs:
        assert r._train_window(next(windows)[0], 1) is not None
    return hs


@pytest.mark.parametrize("name,kw", [("embedded_domino", {}), ("embedded_dflash", {}),
                                     ("embedded_domino", {"packing": True, "grad_accumulation_steps": 2})])
def test_an_optimiser_step_waits_for_the_gpu_at_most_twice(tmp_path, name, kw):
    """Two syncs per window: the window's Σw, then the finite check, metrics and gradient norm together. Before this
    change the same step of embedded_domino made 19 (anchors 2, anchor checks 2, the target's mask 2, the dual CE's label
    range 2, weighted-slot count 2, λ check 3, 3 reductions and 3 copies to the host)."""
    r = _recipe(tmp_path, name, **kw)
    try: hs = _window_syncs(r)
    finally: r.close()
    assert hs.n <= 2, hs.where


class _ChecksOnDevice(RECIPES["domino"]):
    "The fault: the trainer rebuilds its targets from the device batch, checking anchors and counting slots there."
    def _run_trainer_step(self, batch, features, model=None):
        return super()._run_trainer_step({k: v for k, v in batch.items() if k != "targets"}, features, model)


class _LogsEachMicroBatch(RECIPES["domino"]):
    "The fault: a float() of the loss per micro-batch, as a progress print would."
    def _micro_step(self, batch, scale, sync):
        out = super()._micro_step(batch, scale, sync)
        self.last_loss = float(out["loss"].detach())
        return out


@pytest.mark.parametrize("recipe_class", [_ChecksOnDevice, _LogsEachMicroBatch])
def test_the_count_catches_a_sync_in_the_step(tmp_path, recipe_class):
    r = _recipe(tmp_path, recipe_class=recipe_class)
    try: hs = _window_syncs(r)
    finally: r.close()
    assert hs.n > 2, hs.where


def test_recipe_builds_fused_adamw_on_cuda(tmp_path):
    "The recipe asks `adamw_kernel` for the accelerator's device; told CUDA it builds a fused AdamW (CPU fused runs too)."
    import domino_research.train as train
    with unittest.mock.patch.object(train, "adamw_kernel", return_value={"fused": True}) as kernel:
        r = _recipe(tmp_path)
    try:
        kernel.assert_called_once_with(r.accelerator.device)
        assert getattr(r.optimizer, "optimizer", r.optimizer).defaults["fused"] is True
    finally: r.close()
    assert train.adamw_kernel(torch.device("cuda", 0)) == {"fused": True} and train.adamw_kernel("cpu") == {}


def test_target_mask_built_on_the_device_equals_transformers_own():
    """The 4-D mask the recipe hands the SDPA target (so transformers need not ask the GPU whether it may drop a 2-D one)
    gives the features transformers' own mask gives, bit for bit: padded rows, full rows, packed rows. A mask that drops
    the padding or the conversation boundary does not."""
    from domino_research.embedded import resolve_target_path
    from domino_research.target import capture_features, load_target
    from domino_research.train import TrainDFlashRecipe, _layout
    target = load_target(resolve_target_path("embedded"), device="cpu")
    r = TrainDFlashRecipe.__new__(TrainDFlashRecipe)
    r.target = target
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (3, 20), generator=g)
    pad = torch.ones(3, 20, dtype=torch.long)
    pad[1, 15:] = 0
    pad[2, 7:] = 0
    pos = torch.cat([torch.arange(6), torch.arange(10), torch.arange(4)])[None].repeat(3, 1)
    pos[2] = torch.arange(20)                                        # a row of one conversation among packed ones
    cases = {"padded": dict(input_ids=ids, attention_mask=pad), "full": dict(input_ids=ids, attention_mask=torch.ones_like(pad)),
             "packed": dict(input_ids=ids, attention_mask=torch.ones_like(pad), position_ids=pos)}
    for layout, batch in cases.items():
        ref = capture_features(target, ids, [1, 5], None if "position_ids" in batch else batch["attention_mask"],
                               position_ids=batch.get("position_ids"))
        batch["layout"] = _layout(batch)
        assert batch["layout"] == layout
        mask, positions = r._target_mask(batch)
        assert torch.equal(capture_features(target, ids, [1, 5], mask, position_ids=positions), ref), layout
        if mask is not None:                                         # the faults: padding, or the boundary, ignored
            causal = torch.ones(20, 20, dtype=torch.bool).tril().expand_as(mask)
            assert not torch.equal(capture_features(target, ids, [1, 5], causal, position_ids=positions), ref), layout


def _validation_syncs(tmp_path, drop_targets=False) -> tuple[HostSyncs, int]:
    """Host syncs of a validation pass, counting neither collation nor the trainer's preparation of a batch (both work on
    host tensors, before the copy); asserts that preparation never sees a batch already on the device. `drop_targets`:
    the fault, a batch whose targets are left for the forward to rebuild on the device."""
    import domino_research.train as train
    cfg = load_train_config("embedded_domino", run_name="vsyncs", output_dir=str(tmp_path / "runs"), n_eval_prompts=0,
                            data_cache_dir=str(tmp_path / "cache"), max_train_samples=16, max_eval_samples=3)
    r = RECIPES[cfg.recipe](cfg).setup()
    trainer, hs, moved = r._bare_trainer(), HostSyncs(), set()
    to_device, prepare, collate = r._to_device, trainer.prepare_batch, train.collate_chat
    def tracked_to_device(b):
        out = to_device(b)
        moved.add(id(out))
        return out
    def host_prepare(b, generator):
        assert id(b) not in moved, "validation prepared a batch already on the device"
        with hs.paused(): w = prepare(b, generator)
        if drop_targets: b.pop("targets", None)
        return w
    def host_collate(*a, **k):
        with hs.paused(): return collate(*a, **k)
    try:
        with unittest.mock.patch.object(r, "_to_device", tracked_to_device), \
                unittest.mock.patch.object(trainer, "prepare_batch", host_prepare), \
                unittest.mock.patch.object(train, "collate_chat", host_collate), hs:
            r.validate()
        return hs, len(r.eval_set)
    finally: r.close()


def test_validation_samples_its_anchors_on_the_host(tmp_path):
    """Validation prepares each batch (anchors, targets) on the host before its copy, like training: its forwards then
    wait for nothing in the trainer. Before this change each validation batch sampled and checked its anchors on the
    device (2-4 waits per batch); the fault below, targets rebuilt by the forward, brings such waits back."""
    hs, rows = _validation_syncs(tmp_path)
    in_trainer = [w for w in hs.where if w.split(" @ ")[1].startswith(("domino.py", "blocks.py", "loss.py"))]
    assert not in_trainer, hs.where
    faulty, _ = _validation_syncs(tmp_path / "fault", drop_targets=True)
    assert faulty.n >= hs.n + rows, (faulty.where, hs.where)
