"""Docs that cannot drift from the code: CI runs README's test commands."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _shell_commands(script: str) -> list[str]:
    """The simple commands of shell text: comments dropped, continuation lines joined, split at &&, || and ;."""
    out = []
    for line in script.replace("\\\n", " ").splitlines():
        if line.lstrip().startswith("#"):
            continue
        out += [" ".join(part.split()) for part in re.split(r"&&|\|\||;", line) if part.strip()]
    return out


def test_ci_runs_the_readme_test_commands_in_order() -> None:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"Run the tests .*?```sh\n(.*?)```", readme, re.DOTALL)
    assert block, "README has no 'Run the tests' block"
    wanted = _shell_commands(block.group(1))
    assert "python3 -m pytest" in wanted
    ci = iter(_shell_commands((ROOT / ".ci" / "run").read_text()))
    missing = [command for command in wanted if command not in ci]  # `in` consumes: order counts
    assert not missing, f".ci/run does not run README's test commands in its order: {missing}"
