"""Data flows one way: core <- collect <- importers, core <- features <- models <- train / predictor <- api <- cli.

Every module of the package is scanned (imports inside functions included), `from perfpredict import X` resolves
to X, and nothing is exempt by name. A module whose stage is not in the table is itself a violation, so a new
package cannot slip past the rule. The checker is proved able to fail by a tree with bad imports."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "perfpredict"
# What each stage may import from perfpredict (its own stage always). "" is the package's own __init__.
ALLOWED = {
    "": {"api", "core"},  # the lazy facade: perfpredict.rank / predict / Cluster ...
    "core": set(),
    "catalog": set(),  # data files only
    "collect": {"core"},
    "importers": {"core", "collect"},
    "features": {"core"},
    "models": {"core", "features"},
    "train": {"core", "features", "models"},
    "predictor": {"core", "features", "models"},
    "api": {"core", "features", "models", "predictor"},
    "cli": {"core", "collect", "importers", "features", "models", "train", "predictor", "api"},
}


def _stage(path: Path, root: Path) -> str:
    rel = path.relative_to(root)
    if len(rel.parts) == 1:
        return "" if rel.name == "__init__.py" else rel.stem
    return rel.parts[0]


def _imported_stages(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] != "perfpredict":
                continue
            if len(parts) > 1:
                out.append((node.lineno, parts[1]))
            else:  # from perfpredict import api, core
                out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            out.append((node.lineno, "<relative import>"))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[1]) for a in node.names
                    if a.name.startswith("perfpredict.")]
    return out


def violations(root: Path) -> list[str]:
    bad = []
    for f in sorted(root.rglob("*.py")):
        stage = _stage(f, root)
        where = f.relative_to(root.parent)
        if stage not in ALLOWED:
            bad.append(f"{where}: stage {stage!r} is not in the layering table")
            continue
        for line, mod in _imported_stages(f):
            if mod != stage and mod not in ALLOWED[stage] and mod != "__version__":
                bad.append(f"{where}:{line} ({stage or 'perfpredict'}) imports perfpredict.{mod}")
    return bad


def test_no_import_against_the_flow():
    bad = violations(PKG)
    assert not bad, "\n".join(bad)


def test_every_stage_in_the_table_exists():
    present = {_stage(f, PKG) for f in PKG.rglob("*.py")}
    assert set(ALLOWED) - {"catalog"} <= present | {""}, sorted(set(ALLOWED) - present)


@pytest.mark.parametrize("stage,file,source,expect", [
    ("core", "x.py", "from perfpredict import api\n", "imports perfpredict.api"),
    ("features", "y.py", "def f():\n    from perfpredict.predictor.rank import rank_plans\n",
     "imports perfpredict.predictor"),
    ("predictor", "cli.py", "import perfpredict.api\n", "imports perfpredict.api"),  # no exemption by file name
    ("collect", "probes/z.py", "from perfpredict.features.plans import PlanSpace\n", "imports perfpredict.features"),
    ("api", "w.py", "from perfpredict.cli import app\n", "imports perfpredict.cli"),
    ("newstage", "v.py", "x = 1\n", "not in the layering table"),
    ("models", "u.py", "from ..train import fit\n", "imports perfpredict.<relative import>"),
])
def test_checker_fails_on_a_bad_import(tmp_path, stage, file, source, expect):
    root = tmp_path / "perfpredict"
    target = root / stage / file
    target.parent.mkdir(parents=True)
    (root / "__init__.py").write_text("")
    target.write_text(source)
    bad = violations(root)
    assert bad and expect in bad[0], bad


COLLECTORS = {"probes", "harness", "trl", "vllm"}
# A session on a lent machine runs several collectors (collect.device): it may import them, none imports it.
SESSIONS = {"device"}


def _collect_parts(path: Path) -> list[tuple[int, str]]:
    """(line, the part of perfpredict.collect imported: a top-level module or a collector subpackage)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "perfpredict.collect":
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("perfpredict.collect."):
            out.append((node.lineno, node.module.split(".")[2]))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[2]) for a in node.names if a.name.startswith("perfpredict.collect.")]
    return out


def test_collectors_share_only_collects_top_level_modules():
    """A collector package (probes, harness, trl, vllm) imports collect's shared top-level modules, never another
    collector."""
    collect = PKG / "collect"
    assert {d.name for d in collect.iterdir() if (d / "__init__.py").is_file()} == COLLECTORS | SESSIONS
    bad = []
    for f in sorted(collect.rglob("*.py")):
        rel = f.relative_to(collect)
        own = rel.parts[0] if len(rel.parts) > 1 else None
        if own in SESSIONS:
            continue
        bad += [f"{f.relative_to(PKG.parent)}:{line} imports perfpredict.collect.{part}"
                for line, part in _collect_parts(f) if part in COLLECTORS | SESSIONS and part != own]
    assert not bad, "\n".join(bad)


# `-m perfpredict.x.y` in a command list (`"-m", "perfpredict.x.y"`) or a usage line of a docstring.
LAUNCH = re.compile(r"""-m["']?,?\s*["']?(perfpredict(?:\.\w+)+)""")


def test_every_module_launched_by_path_exists():
    seen, missing = set(), []
    for f in sorted(PKG.rglob("*.py")):
        for mod in LAUNCH.findall(f.read_text()):
            seen.add(mod)
            p = PKG.parent.joinpath(*mod.split("."))
            if not (p.with_suffix(".py").is_file() or (p / "__main__.py").is_file()):
                missing.append(f"{f.relative_to(PKG.parent)}: -m {mod}")
    assert {"perfpredict.collect.harness.run_step", "perfpredict.collect.probes.comm_probe",
            "perfpredict.collect.trl.worker", "perfpredict.collect.vllm.worker", "perfpredict.importers"} <= seen
    assert not missing, "\n".join(missing)
