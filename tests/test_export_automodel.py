"""A real trained draft exported for serving (runs/serving/served_domino, the draft the README's GPU quick-start's
convention describes) loaded the three ways a user would: transformers' plain `AutoModel` stops with an error instead of
returning a `Qwen3Model` that is not the draft; `trust_remote_code=True` and `load_draft` give the draft, weight for
weight; the config keys SGLang and vLLM read are all there. The fault it exists for (the usual `initializer_range`)
is shown to give the silent `Qwen3Model` back."""
import json

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
from transformers.models.qwen3.modeling_qwen3 import Qwen3Model

from conftest import REPO
from domino_research.export import (NO_RANDOM_INIT, SERVING_ENGINES, export_draft, load_draft, self_description_problems,
                                    serving_problems)

SERVED = REPO / "runs" / "serving" / "served_domino"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.set_num_threads(1)
    return export_draft(SERVED, tmp_path_factory.mktemp("export") / "draft")


def test_plain_automodel_fails_loudly(exported):
    assert json.loads((exported / "config.json").read_text())["initializer_range"] == NO_RANDOM_INIT
    for auto in (AutoModel, AutoModelForCausalLM):
        with pytest.raises(RuntimeError, match="normal expects std >= 0.0"): auto.from_pretrained(exported)


def test_the_real_draft_loads(exported):
    mine = load_draft(exported)
    remote = AutoModel.from_pretrained(exported, trust_remote_code=True)
    assert type(remote).__name__ == "DFlashDraftModel" and hasattr(remote, "prefix_gru")
    want = mine.state_dict()
    assert sorted(remote.state_dict()) == sorted(want)
    for k, v in remote.state_dict().items(): assert torch.equal(v, want[k]), k
    assert self_description_problems(exported) == []


def test_engines_keep_their_config(exported):
    cfg = AutoConfig.from_pretrained(exported)           # what vLLM's and SGLang's config parsers build
    assert (cfg.model_type, cfg.architectures) == ("qwen3", ["DFlashDraftModel"])
    for engine in SERVING_ENGINES:                       # the same findings as for the source draft: no key lost
        assert serving_problems(exported, engine) == serving_problems(SERVED, engine)
        assert not any("config.json has no" in p for p in serving_problems(exported, engine))


def test_fault_usual_initializer_range_gives_silent_qwen3model(exported, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in exported.iterdir(): (bad / f.name).write_bytes(f.read_bytes())
    js = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**js, "initializer_range": 0.02}))
    wrong = AutoModel.from_pretrained(bad)                # no error: another model, with a random embedding
    assert type(wrong) is Qwen3Model and not hasattr(wrong, "fc")
    assert "is not negative" in self_description_problems(bad)[0]


def test_the_shipped_served_draft_describes_itself():
    "The committed served example is described by the current code: no self-description problem (initializer_range -1 included)."
    from domino_research.export import self_description_problems
    assert self_description_problems(SERVED / "draft") == []
