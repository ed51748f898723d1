"""Every `perfpredict ...` command the README shows runs and exits 0.

Commands that measure or train are checked with `--help` only (they need torch, vLLM, the datasets or minutes);
files the commands would write go into a temporary folder. A command the CLI does not have fails: the README names
only commands that exist."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from perfpredict.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_CHARS = 15_000
# Leading words of commands that measure, train or rewrite committed files: run with --help instead.
HELP_ONLY = (("collect",), ("generate", "collect"), ("train",), ("evaluate",), ("generate", "evaluate"),
             ("import-public",), ("report",))
# Options whose value is a file or folder the command writes ("-" is stdout and stays).
OUTPUT_OPTIONS = ("--emit-dir", "--json", "--plot", "--csv", "--out")


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)


def readme_commands(text: str) -> list[list[str]]:
    """The argument lists (without the leading `perfpredict`) of every command in the README's bash blocks: `\\`
    continuations joined, `#` comments dropped, each `&&` segment that starts with `perfpredict` taken."""
    out = []
    for block in bash_blocks(text):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            words = shlex.split(line, comments=True)
            segment: list[str] = []
            for w in [*words, "&&"]:
                if w != "&&":
                    segment.append(w)
                    continue
                if segment[:1] == ["perfpredict"] and len(segment) > 1:
                    out.append(segment[1:])
                segment = []
    return out


def _is_group(cmd: object) -> bool:
    # Duck-typed: typer may vendor its own click, whose Group is not the installed click's.
    return isinstance(getattr(cmd, "commands", None), dict)


def _leaf_path(args: list[str]) -> list[str] | None:
    """The command words of `args` if the CLI knows every one of them (e.g. ["generate", "rank"]), else None."""
    cmd = typer.main.get_command(app)
    assert _is_group(cmd), "perfpredict.cli.app should be a command group"
    path = []
    for word in args:
        if not _is_group(cmd):
            break
        sub = cmd.commands.get(word)
        if sub is None:
            return None
        path.append(word)
        cmd = sub
    return path if path and not _is_group(cmd) else None


def _rewrite_outputs(args: list[str], tmp: Path) -> list[str]:
    out = list(args)
    for i, w in enumerate(out[:-1]):
        if w in OUTPUT_OPTIONS and out[i + 1] != "-":
            out[i + 1] = str(tmp / Path(out[i + 1]).name)
    return out


COMMANDS = readme_commands(README.read_text())


def test_readme_is_short() -> None:
    text = README.read_text()
    assert len(text) < MAX_README_CHARS, f"README.md has {len(text):,} characters; keep it under {MAX_README_CHARS:,}"


def test_readme_shows_commands() -> None:
    firsts = {c[0] for c in COMMANDS}
    assert {"rank", "predict", "catalog", "plans"} <= firsts, firsts


def test_readme_parser_joins_continuations_and_chains() -> None:
    text = "```bash\npython -m pip install . && perfpredict rank --model m \\\n  --top 3  # note\n```\n"
    assert readme_commands(text) == [["rank", "--model", "m", "--top", "3"]]


def test_command_paths_resolve() -> None:
    assert _leaf_path(["catalog", "gpus"]) == ["catalog"]
    assert _leaf_path(["rank", "--model", "m"]) == ["rank"]
    assert _leaf_path(["no-such-command"]) is None


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(c)[:80] for c in COMMANDS])
def test_readme_command_runs(args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _leaf_path(args)
    assert path is not None, f"the README names `perfpredict {' '.join(args[:2])}`, which the CLI does not have"
    monkeypatch.chdir(ROOT)  # example scenario paths are relative to the checkout
    if any(tuple(path[:len(h)]) == h for h in HELP_ONLY):
        argv = [*path, "--help"]
    else:
        argv = _rewrite_outputs(args, tmp_path)
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, f"perfpredict {' '.join(argv)} exited {res.exit_code}:\n{res.output[-2000:]}"
