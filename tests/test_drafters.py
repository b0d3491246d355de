"""The drafter interface end to end (notebook 30's registry): a toy drafter registered here runs through `bench decode`,
`evaluate_draft` and an ablation table with no other edit, and the EAGLE-3 drafter decodes an exported EAGLE-3 folder
through `evaluate_draft` and `bench decode`, losslessly, on the embedded target."""
import json
from dataclasses import dataclass

import pytest
import torch

from domino_research.config import ranged
from domino_research.decode import DRAFTERS, drafter_settings, register_drafter

from conftest import REPO, write_config


@dataclass
class RepeatSettings:
    k: int = ranged(3, ">= 1")  # proposals per step: the anchor, k times


class RepeatAnchor:
    "A toy drafter: proposes the anchor repeated `k` times (one-hot q at T > 0); reads no target features, needs no draft."
    Settings, layer_ids = RepeatSettings, []

    def __init__(self, k: int, vocab: int, temperature: float = 0.0):
        self.k, self.V, self.temperature, self.block_size = k, vocab, temperature, k + 1

    @classmethod
    def build(cls, target, settings, draft=None, timer=None, temperature=0.0, generator=None):
        return cls(drafter_settings(cls, settings).k, target.get_output_embeddings().weight.shape[0], temperature)

    def describe(self) -> dict: return {"drafter": self.name, "k": self.k}

    def __call__(self, ctx, anchor, start, tokens):
        props = [anchor] * self.k
        if self.temperature <= 0: return props
        return props, torch.nn.functional.one_hot(torch.tensor(props), self.V).float()


@pytest.fixture
def repeat_anchor():
    "RepeatAnchor registered as `repeat_anchor` for one test (the package's registry as it was afterwards)."
    register_drafter("repeat_anchor")(RepeatAnchor)
    yield RepeatAnchor
    DRAFTERS.pop("repeat_anchor", None)


def test_a_registered_toy_drafter_runs_everywhere(repeat_anchor, tiny, tmp_path, capsys, monkeypatch):
    "Registered, and nothing else edited: bench decode, evaluate_draft and an ablation table run it, lossless."
    from domino_research.ablations import run_ablation
    from domino_research.variants import Variant
    from domino_research.bench import main
    from domino_research.evaluation import evaluate_draft
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)       # in-process: leave the test process's threads alone
    target, prompts = str(tiny["root"] / "target"), tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("count from 3", "count from 40", "say 7 7 7")))
    # the command line: its setting is an option (help from its comment), its description the result's drafter
    main(["decode", "--drafter", "repeat_anchor", "--k", "2", "--target", target, "--prompts", str(prompts),
          "--n_eval_prompts", "2", "--max_new_tokens", "12", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert (res["drafter"], res["block_size"], res["lossless"], len(res["per_slot_acceptance"])) == \
        ({"drafter": "repeat_anchor", "k": 2}, 3, True, 2)
    # the evaluation, greedy and sampled
    ev = evaluate_draft(None, target=target, prompts=prompts, n_prompts=3, max_new_tokens=12, drafter="repeat_anchor", k=4,
                        progress=False)
    assert (ev["drafter"], ev["lossless"], ev["block_size"]) == ({"drafter": "repeat_anchor", "k": 4}, True, 5)
    hot = evaluate_draft(None, target=target, prompts=prompts, n_prompts=2, max_new_tokens=8, drafter="repeat_anchor",
                         temperature=0.7, progress=False)
    assert hot["lossless"] is None and 1 <= hot["tau"] <= 4
    # an ablation table: a variant holding the drafter trains nothing and is decoded like any other row
    configs = {"embedded_domino": write_config(tmp_path / "domino.yaml", tiny["base"])}
    table = {"repeat2": Variant("embedded_domino", {}, "the anchor twice", drafter={"drafter": "repeat_anchor", "k": 2})}
    out = run_ablation(["repeat2"], steps=1, seeds=[0], out_dir=tmp_path / "abl", n_eval_prompts=2, max_new_tokens=8,
                       prompts=prompts, configs=configs, table=table, log=lambda *a: None)
    row = out["variants"]["repeat2"]
    assert (row["drafter"], row["recipe"], row["block_size"], row["lossless"], row["per_seed"]["0"]["steps"]) == \
        ({"drafter": "repeat_anchor", "k": 2}, None, 3, True, 0)
    assert "| `repeat2` | repeat_anchor | `k=2` | 3 |" in (tmp_path / "abl" / "results.md").read_text()
    assert not list((tmp_path / "abl").rglob("*.safetensors"))             # nothing was trained
    # the fault the registry guards against: a name nobody registered is refused in one line by each entry point
    DRAFTERS.pop("repeat_anchor")
    with pytest.raises(SystemExit):
        main(["decode", "--drafter", "repeat_anchor", "--target", target, "--prompts", str(prompts), "--json"])
    assert "drafter 'repeat_anchor' is not registered; choose one of draft, lookup" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not registered"):
        evaluate_draft(None, target=target, prompts=prompts, drafter="repeat_anchor")


def test_bench_decode_refuses_another_drafters_setting(repeat_anchor, tiny, capsys):
    "A setting of a drafter other than the chosen one is refused in one line naming the chosen drafter's settings."
    from domino_research.bench import main
    for argv, needle in [(["--drafter", "lookup", "--k", "2"], "--k: not a setting of drafter 'lookup' (its settings: "
                                                                "prompt_lookup_min, prompt_lookup_max, num_speculative_tokens, "
                                                                "occurrence, self_extend)"),
                         (["--drafter", "repeat_anchor", "--use_head", "false"], "--use_head: not a setting of drafter "
                                                                                 "'repeat_anchor' (its settings: k)"),
                         (["--drafter", "repeat_anchor", "--draft", "x"], "--draft: drafter 'repeat_anchor' decodes with "
                                                                         "no trained draft"),
                         (["--drafter", "eagle3"], "--draft DIR is required with --drafter eagle3")]:
        with pytest.raises(SystemExit) as e:
            main(["decode", *argv, "--target", str(tiny["root"] / "target")])
        err = capsys.readouterr().err
        assert e.value.code == 2 and needle in err and "Traceback" not in err, err


# ---------------------------------------------------------------- the hybrid on a kept study-28 draft

KEPT_DOMINO = REPO / "runs" / "ablations" / "study28" / "steps2880" / "runs" / "domino" / "seed0"


def test_bench_decode_hybrid_on_a_kept_draft(capsys, monkeypatch):
    """`bench decode --drafter hybrid` with study 28's kept seed-0 Domino draft on the embedded target: prompt lookup and
    the trained draft in one loop, every prompt's tokens the target's greedy ones; the record is the hybrid's settings
    with the draft inside it named (projector_type, shift_label) and `--candidate_k` handed to it, lookup's the swept
    defaults, and proposals were accepted (τ > 1)."""
    from domino_research.bench import main
    from domino_research.decode import HYBRID_DEFAULT_RULE, LOOKUP_DEFAULTS
    if not (KEPT_DOMINO / "draft_bf16").is_dir(): pytest.skip(f"no kept draft in {KEPT_DOMINO}")
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)       # in-process: leave the test process's threads alone
    main(["decode", "--drafter", "hybrid", "--draft", str(KEPT_DOMINO), "--n_eval_prompts", "3", "--max_new_tokens", "32",
          "--warmup", "0", "--candidate_k", "64", "--per_prompt", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert res["lossless"] is True and all(r["lossless_spec"] for r in res["per_prompt"]), res["per_prompt"]
    # the record names the trained draft inside the hybrid, and --candidate_k reached it
    assert res["drafter"] == {"drafter": "hybrid", "rule": HYBRID_DEFAULT_RULE, "projector_type": "domino",
                              "shift_label": True, "use_head": True, "candidate_k": 64, **LOOKUP_DEFAULTS}
    assert (res["projector_type"], res["shift_label"]) == ("domino", True)
    assert res["block_size"] == 16 and res["tau"] > 1, res["tau"]


# ---------------------------------------------------------------- EAGLE-3 on the embedded target

@pytest.fixture(scope="module")
def eagle3_export(tmp_path_factory):
    "An untrained EAGLE-3 draft for the embedded target (large random weights), exported as SGLang reads it (notebook 31)."
    try:
        from domino_research.embedded import load_embedded_target
        model, tok = load_embedded_target()
    except Exception as e:  # noqa: BLE001 — the artifacts are built by another notebook
        pytest.skip(f"embedded target not available: {type(e).__name__}: {e}")
    from domino_research.eagle3 import Eagle3DraftModel, eagle3_qwen3_config
    from domino_research.export import export_eagle3_draft
    d = tmp_path_factory.mktemp("eagle3")
    torch.manual_seed(0)
    draft = Eagle3DraftModel(eagle3_qwen3_config(model.config, None, 6)).eval()
    with torch.no_grad():
        for name, w in draft.named_parameters():
            if "norm" not in name: w.normal_(0, 0.5)
    draft.save_pretrained(d / "trained")
    return export_eagle3_draft(d / "trained", d / "export", model), (model, tok)


def test_eagle3_drafter_is_lossless_on_the_embedded_target(eagle3_export, monkeypatch):
    """`evaluate_draft(folder, drafter="eagle3")` reads the exported folder back without code and decodes the embedded
    target's test prompts exactly as plain greedy decoding does (rejections, accepts, end-of-turn and the length cut);
    the lossless check it reports fails when a decode drops a token."""
    import domino_research.evaluation as evaluation
    folder, target = eagle3_export
    torch.set_num_threads(1)
    kw = dict(target=target, n_prompts=6, max_new_tokens=48, prompt_seed=None, drafter="eagle3", progress=False)
    res = evaluation.evaluate_draft(folder, **kw)
    assert res["lossless"] is True and all(r["lossless_spec"] for r in res["per_prompt"])
    assert res["drafter"]["drafter"] == "eagle3" and res["block_size"] == 6 and res["projector_type"] is None
    assert res["accept_hist"][1] > 0 and sum(res["accept_hist"][2:]) > 0, res["accept_hist"]   # rejects and accepts both
    assert {r["new_tokens"] < 48 for r in res["per_prompt"]} == {True, False}                    # both stop rules
    assert evaluation.evaluate_draft(folder, **{**kw, "n_prompts": 2, "block_size": 3})["block_size"] == 3
    run_draft = evaluation.evaluate_draft(folder.parent / "trained", **{**kw, "n_prompts": 2})     # a run's draft/ folder too
    assert run_draft["lossless"] is True and run_draft["per_prompt"] == res["per_prompt"][:2] or run_draft["tau"] > 0
    real = evaluation.drafter_generate                                   # the fault: a decode that loses its last token
    monkeypatch.setattr(evaluation, "drafter_generate", lambda *a, **k: (lambda t, s: (t[:-1], s))(*real(*a, **k)))
    assert evaluation.evaluate_draft(folder, **{**kw, "n_prompts": 2})["lossless"] is False


def test_bench_decode_eagle3(eagle3_export, capsys, monkeypatch):
    "`bench decode --drafter eagle3 --draft FOLDER` on the embedded target (the default): one JSON object, lossless."
    from domino_research.bench import main
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    main(["decode", "--drafter", "eagle3", "--draft", str(eagle3_export[0]), "--n_eval_prompts", "2", "--max_new_tokens",
          "16", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert (res["drafter"]["drafter"], res["block_size"], res["lossless"]) == ("eagle3", 6, True)
