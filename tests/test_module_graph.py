"""The module graph follows the notebook order: every import of a package module, at the top of a file or inside a
function, goes to a module of a lower notebook number. So there are no import cycles, and the notebooks read in
order never use what they have not derived yet."""
import ast, re
from pathlib import Path

from conftest import REPO

PKG = REPO / "domino_research"


def notebook_number(py: Path) -> int:
    m = re.search(r"File to edit: \.\./nbs/(\d\d)_\w+\.ipynb", py.read_text())
    assert m, f"{py.name} names no numbered notebook it is generated from"
    return int(m.group(1))


def imported_modules(py: Path) -> set[str]:
    "Package modules `py` imports anywhere: `from .x import`, `from domino_research.x import`, `import domino_research.x`."
    out = set()
    for node in ast.walk(ast.parse(py.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level == 1 and mod: out.add(mod.split(".")[0])
            elif mod.startswith("domino_research."): out.add(mod.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("domino_research.")}
    return out


def test_imports_follow_notebook_order():
    modules = {p.stem: p for p in PKG.glob("*.py") if not p.stem.startswith("_")}
    number = {m: notebook_number(p) for m, p in modules.items()}
    edges = [(m, d) for m, p in modules.items() for d in imported_modules(p) if d in modules and d != m]
    assert edges, "no package imports found: the parser is not reading the modules"
    backwards = [f"{m} ({number[m]:02d}) imports {d} ({number[d]:02d})" for m, d in edges if number[d] >= number[m]]
    assert not backwards, backwards


def test_the_check_catches_a_backward_import(tmp_path):
    py = tmp_path / "x.py"
    py.write_text("# File to edit: ../nbs/05_x.ipynb\ndef f():\n    from .train import main\n")
    assert notebook_number(py) == 5 and imported_modules(py) == {"train"}
