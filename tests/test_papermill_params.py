"Every papermill notebook's `parameters` cell is fully understood by papermill (`--help-notebook`, no 'unknown parameter')."
import ast
import json
from pathlib import Path

import papermill as pm
import pytest

NBS = Path(__file__).resolve().parents[1] / "nbs"
PAPERMILL_NOTEBOOKS = ["train.ipynb", "evaluate.ipynb", "ablations.ipynb"]


def assigned_names(nb_path: Path) -> list[str]:
    "Names the `parameters` cell assigns, read with `ast` (the slow, obvious reference)."
    cells = json.loads(nb_path.read_text())["cells"]
    src = "".join(next(c for c in cells if "parameters" in c.get("metadata", {}).get("tags", []))["source"])
    return [n.target.id for n in ast.parse(src).body if isinstance(n, ast.AnnAssign)]


@pytest.mark.parametrize("name", PAPERMILL_NOTEBOOKS)
def test_papermill_reads_every_parameter(name):
    # papermill parses each line with a regex: `=` in a trailing comment or a `str | None` annotation makes it
    # drop the parameter (and warn "Passed unknown parameter" when one is injected)
    names = assigned_names(NBS / name)
    assert names, f"{name}: no annotated assignments in the parameters cell"
    assert list(pm.inspect_notebook(str(NBS / name))) == names


def check_cells(nb_path: Path) -> tuple[str, str]:
    "The source of the `parameters` cell and of the cell after it, which checks the parameters (`check_params`)."
    cells = json.loads(nb_path.read_text())["cells"]
    i = next(i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", []))
    return "".join(cells[i]["source"]), "".join(cells[i + 1]["source"])


def run_checks(name: str, injected: str) -> dict:
    "What papermill does before the run starts: the parameters cell, the injected assignments, then the check cell."
    params, checks = check_cells(NBS / name)
    assert "check_params(" in checks and "globals()" in checks, f"{name}: the cell after the parameters no longer checks them"
    ns = {}
    for src in (params, injected, checks): exec(src, ns)
    return ns


@pytest.mark.parametrize("name, typo", [("train.ipynb", "max_stepz"), ("evaluate.ipynb", "n_eval_promtps"),
                                        ("ablations.ipynb", "seedz")])
def test_unknown_papermill_parameter_is_refused(name, typo):
    "papermill only warns of `-p max_stepz 2` and the run goes on with the default: the check cell refuses it by name."
    from domino_research.config import ConfigError
    run_checks(name, "")                                       # the defaults pass
    with pytest.raises(ConfigError, match=f"unknown parameter '{typo}'; did you mean"):
        run_checks(name, f"{typo} = 2\n")


def test_train_notebook_says_how_to_resume_before_it_trains(tmp_path, capsys):
    """Ctrl-C stops papermill, which shuts the kernel down mid-run: the resume hint must be printed before training starts
    (it was lost). Followed, it passes the notebook's checks and loads a config that resumes the same run."""
    cells = [c for c in json.loads((NBS / "train.ipynb").read_text())["cells"] if c["cell_type"] == "code"]
    assert "main(config, **overrides)" in "".join(cells[3]["source"]), "the fourth code cell no longer trains"
    ns = {}
    injected = f"output_dir = {str(tmp_path)!r}\nrun_name = 'r1'\noverwrite = True\n"
    for src in ("".join(cells[0]["source"]), injected, *("".join(c["source"]) for c in cells[1:3])): exec(src, ns)
    hint = [l for l in capsys.readouterr().out.splitlines() if l.startswith("if this run stops")]
    assert hint == ["if this run stops, continue it with the same papermill command and -p overwrite False plus "
                    "-p run_name r1 and resume: latest in extra (-p extra \"{resume: latest}\")"], hint
    ns = {}
    followed = f"output_dir = {str(tmp_path)!r}\nrun_name = 'r1'\noverwrite = False\nextra = '{{resume: latest}}'\n"
    for src in ("".join(cells[0]["source"]), followed, *("".join(c["source"]) for c in cells[1:3])): exec(src, ns)
    assert (ns["cfg"].resume, ns["cfg"].run_name, ns["cfg"].overwrite) == ("latest", "r1", False)


# evaluate.ipynb: its parameters are EvalConfig's fields (notebook 32), under the names users type there
EVAL_PARAM_NAMES = {"n_prompts": "n_eval_prompts", "prompts": "prompts_file"}
EVAL_NOTEBOOK_ONLY = {"draft_dir", "target_dir", "drafter_settings", "out_dir", "threads"}
EVAL_SMOKE_DEFAULTS = {"n_eval_prompts": 4, "max_new_tokens": 32}     # a quick run by default; the rest as EvalConfig's


def eval_params_mismatch(config_cls, nb_path: Path) -> list[str]:
    "What keeps evaluate.ipynb's parameters from being `config_cls`'s fields: missing, extra, or another default."
    import dataclasses
    params, _ = check_cells(nb_path)
    ns = {}
    exec(params, ns)
    names = set(assigned_names(nb_path))
    fields = {EVAL_PARAM_NAMES.get(f.name, f.name): f for f in dataclasses.fields(config_cls)}
    out = [f"missing {n}" for n in sorted(set(fields) - names)]
    out += [f"extra {n}" for n in sorted(names - set(fields) - EVAL_NOTEBOOK_ONLY)]
    for n, f in fields.items():
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if n in ns and n not in EVAL_SMOKE_DEFAULTS and n != "candidate_ks" and ns[n] != default:
            out.append(f"default of {n}: {ns[n]!r} != {default!r}")
    return out


def test_evaluate_parameters_are_the_eval_config():
    "Each EvalConfig field is a parameter of evaluate.ipynb with its default; a field added and not exposed is caught."
    import dataclasses
    from domino_research.evaluation import EvalConfig
    assert eval_params_mismatch(EvalConfig, NBS / "evaluate.ipynb") == []
    Wider = dataclasses.make_dataclass("Wider", [("top_p", float, dataclasses.field(default=1.0))], bases=(EvalConfig,))
    assert eval_params_mismatch(Wider, NBS / "evaluate.ipynb") == ["missing top_p"]


def test_evaluate_old_lookup_parameter_names_the_new_spelling():
    "`-p prompt_lookup_max 2` (a parameter before the drafter registry) is refused in one line with the new spelling."
    from domino_research.config import ConfigError
    with pytest.raises(ConfigError, match="parameter 'prompt_lookup_max' is a drafter setting: pass it as -p drafter_settings"):
        run_checks("evaluate.ipynb", "prompt_lookup_max = 2\n")
    ns = run_checks("evaluate.ipynb", "drafter = 'ngram'\ndrafter_settings = '{prompt_lookup_max: 2}'\n")
    assert ns["spec"] == {"drafter": "lookup", "prompt_lookup_max": 2} and ns["cfg"].n_prompts == 4
    with pytest.raises(ConfigError, match="'use_head' is neither an evaluation key nor a setting of drafter 'lookup'"):
        run_checks("evaluate.ipynb", "drafter = 'lookup'\ndrafter_settings = '{use_head: false}'\n")
