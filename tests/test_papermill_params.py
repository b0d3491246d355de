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
