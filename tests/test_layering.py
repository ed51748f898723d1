"""The stages import only downstream of collect -> features -> train -> predictor -> cli: the learned models live in
learn/, which train and predictor both import, so no stage reaches into a later one (the guide's "no arrow against
the flow"). The public-data importers, a source of datasets like collect, import only core. Inside collect, each
collector (probes, harness, trl, vllm) imports only collect's shared top-level modules, never another collector.
Checked on the source, imports inside functions included."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "perfpredict"
# Which subpackages each may import from perfpredict; core/catalog are shared by all.
ALLOWED = {
    "core": {"core"},
    "features": {"core", "features"},
    "learn": {"core", "features", "learn"},
    "train": {"core", "features", "learn", "train"},
    "predictor": {"core", "features", "learn", "predictor"},
    "importers": {"core", "importers"},
}
STAGES = {"core", "features", "learn", "train", "predictor", "collect", "importers", "cli", "api"}
# The CLI modules inside predictor/ and train/ sit on top of the library facade (perfpredict.api), like cli.py
# does; train's `import-public` command runs the importers.
CLI_MODULES = {"cli.py", "generate_cli.py"}
CLI_MAY_IMPORT = {"api", "importers"}
COLLECTORS = {"probes", "harness", "trl", "vllm"}


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("perfpredict."):
            out.append((node.lineno, node.module.split(".")[1]))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[1]) for a in node.names if a.name.startswith("perfpredict.")]
    return out


@pytest.mark.parametrize("stage", sorted(ALLOWED))
def test_no_import_against_the_flow(stage):
    bad = [f"{f.relative_to(PKG.parent)}:{line} imports perfpredict.{mod}"
           for f in sorted((PKG / stage).rglob("*.py")) for line, mod in _imports(f)
           if mod in STAGES and mod not in ALLOWED[stage] and not (f.name in CLI_MODULES and mod in CLI_MAY_IMPORT)]
    assert not bad, "\n".join(bad)


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
    collect = PKG / "collect"
    assert {d.name for d in collect.iterdir() if (d / "__init__.py").is_file()} == COLLECTORS
    bad = []
    for f in sorted(collect.rglob("*.py")):
        rel = f.relative_to(collect)
        own = rel.parts[0] if len(rel.parts) > 1 else None
        if own is None and f.name == "cli.py":
            continue  # the CLI dispatches to every collector
        bad += [f"{f.relative_to(PKG.parent)}:{line} imports perfpredict.collect.{part}"
                for line, part in _collect_parts(f) if part in COLLECTORS and part != own]
        bad += [f"{f.relative_to(PKG.parent)}:{line} imports perfpredict.{mod}"
                for line, mod in _imports(f) if mod in STAGES - {"core", "collect"}]
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
