"""Install works on every Python that pyproject.toml admits: the declared floor (pyproject, settings.ini, README) is one
version, and every pin in constraints.txt admits it (each installed distribution's Requires-Python metadata; no network)."""
import configparser, re, tomllib
from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from conftest import REPO


def declared_floors() -> dict:
    "The minimum Python each file declares."
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    ini = configparser.ConfigParser()
    ini.read(REPO / "settings.ini")
    readme = re.search(r"Python ≥ (\d+\.\d+)", (REPO / "README.md").read_text())
    return {"pyproject.toml requires-python": re.fullmatch(r">=\s*(\d+\.\d+)", pyproject.strip()).group(1),
            "settings.ini min_python": ini["DEFAULT"]["min_python"], "README.md 'Python ≥'": readme and readme.group(1)}


def pins() -> dict:
    "name -> version of every `name==version` line of constraints.txt."
    out = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, ver = line.split("==")
            out[name.strip()] = ver.strip()
    return out


def test_declared_floor_is_one_version():
    floors = declared_floors()
    assert len(set(floors.values())) == 1, f"the Python floor differs between files: {floors}"


def test_every_pin_admits_the_floor():
    floor = Version(declared_floors()["pyproject.toml requires-python"])
    bad, unchecked = [], []
    for name, ver in pins().items():
        try: dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            unchecked.append(f"{name}=={ver} (not installed)")
            continue
        if Version(dist.version).base_version != Version(ver).base_version:   # torch==X pins the local build X+cpu
            unchecked.append(f"{name}=={ver} (installed {dist.version})")
            continue
        req = dist.metadata.get("Requires-Python")
        if req and not SpecifierSet(req).contains(floor): bad.append(f"{name}=={ver} needs Python {req}")
    assert not unchecked, (
        f"constraints.txt pins that this environment cannot check (rebuild it from constraints.txt): {unchecked}"
    )
    assert not bad, f"pyproject.toml admits Python {floor}, but constraints.txt pins {'; '.join(bad)}: raise the floor"
