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
