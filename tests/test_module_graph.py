"""The module graph follows the notebook order: every import of a package module, at the top of a file or inside a
function, goes to a module of an earlier notebook (`08a_files` comes after `08_progress` and before `09_train_config`).
So there are no import cycles, and the notebooks read in order never use what they have not derived yet. And no module
imports another module's private (underscore) name: what one module uses of another is that module's public API."""
import ast, re
from pathlib import Path

from conftest import REPO

PKG = REPO / "domino_research"


def notebook_key(py: Path) -> str:
    "The notebook's number as it sorts: `00`, `08a`, `09`, ... (the name part of `nbs/08a_files.ipynb`)."
    m = re.search(r"File to edit: \.\./nbs/(\d\d[a-z]?)_\w+\.ipynb", py.read_text())
    assert m, f"{py.name} names no numbered notebook it is generated from"
    return m.group(1)


def package_imports(py: Path) -> list[tuple[str, list[str]]]:
    """(package module, names) of each import in `py`: `from .x import`, `from domino_research.x import`,
    `import domino_research.x`."""
    out = []
    for node in ast.walk(ast.parse(py.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            names = [a.name for a in node.names]
            if node.level == 1 and mod: out.append((mod.split(".")[0], names))
            elif mod.startswith("domino_research."): out.append((mod.split(".")[1], names))
        elif isinstance(node, ast.Import):
            out += [(a.name.split(".")[1], []) for a in node.names if a.name.startswith("domino_research.")]
    return out


def imported_modules(py: Path) -> set[str]:
    return {m for m, _ in package_imports(py)}


def private_imports(py: Path) -> list[str]:
    "`module._name` for each underscore name `py` imports from another package module."
    return [f"{m}.{n}" for m, names in package_imports(py) if m != py.stem for n in names if n.startswith("_")]


def modules() -> dict[str, Path]:
    return {p.stem: p for p in PKG.glob("*.py") if not p.stem.startswith("_")}


def test_imports_follow_notebook_order():
    mods = modules()
    key = {m: notebook_key(p) for m, p in mods.items()}
    edges = [(m, d) for m, p in mods.items() for d in imported_modules(p) if d in mods and d != m]
    assert edges, "no package imports found: the parser is not reading the modules"
    backwards = [f"{m} ({key[m]}) imports {d} ({key[d]})" for m, d in edges if key[d] >= key[m]]
    assert not backwards, backwards


def test_the_check_catches_a_backward_import(tmp_path):
    py = tmp_path / "x.py"
    py.write_text("# File to edit: ../nbs/05_x.ipynb\ndef f():\n    from .train import main\n")
    assert notebook_key(py) == "05" and imported_modules(py) == {"train"}
    py.write_text("# File to edit: ../nbs/08a_files.ipynb\n")
    assert "08" < notebook_key(py) < "09"


def test_no_private_name_crosses_modules():
    found = {m: private_imports(p) for m, p in modules().items()}
    assert any(names for m, names in package_imports(PKG / "train.py")), "the parser reads no import of train.py"
    crossing = {m: names for m, names in found.items() if names}
    assert not crossing, f"underscore names imported from another module (make them public): {crossing}"


def test_the_check_catches_a_private_import(tmp_path):
    py = tmp_path / "evaluation.py"        # the import this test replaced: lifecycle's private JSON writer
    py.write_text("from .lifecycle import (read_metrics,\n    _write_json)\ndef f():\n    from domino_research.data import _x\n"
                  "from .evaluation import _own   # its own private name is no crossing\n")
    assert private_imports(py) == ["lifecycle._write_json", "data._x"]
