"""Docs that cannot drift from the code: README's Spark settings are the plugin's, CI runs README's test
commands, every PROTOCOL.md section and repository path named exists, image tags carry the package's
version, and the text describes behaviour rather than pointing at issue numbers."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuffled import __version__, spark_settings
from shuffled.spark_settings import SettingsSourceError

ROOT = Path(__file__).resolve().parents[2]
#: where the project's own text is: code, tests, docs, deploy files (not build output or the venv)
TEXT_ROOTS = ("shuffled", "client", "tests", "benchmarks", "docs", "proto", "deploy", ".ci")
TEXT_SUFFIXES = {".py", ".java", ".md", ".json", ".yaml", ".yml", ".toml", ".conf", ".service", ""}
#: generated or copied trees: build output, benchmark results, and shuffled/jvm (client/jvm/src again)
SKIPPED = ("build", "results", "__pycache__")


def _text_files() -> Iterator[Path]:
    yield from sorted(ROOT.glob("*.md"))
    yield ROOT / "Dockerfile"
    for root in TEXT_ROOTS:
        for path in sorted((ROOT / root).rglob("*")):
            parts = path.relative_to(ROOT).parts
            if any(part in SKIPPED for part in parts) or parts[:2] == ("shuffled", "jvm"):
                continue
            if path.is_file() and path.suffix in TEXT_SUFFIXES:
                yield path


def test_readme_spark_settings_are_generated_from_shuffled_conf() -> None:
    readme = (ROOT / "README.md").read_text()
    rows = spark_settings.render_markdown()
    assert rows.count("\n") >= 9, rows
    assert rows in readme, "README's Spark table is stale: paste the output of `python -m shuffled.spark_settings`"


UNDOCUMENTED = '\n    static final String X = "spark.shuffled.x";'


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (('getTimeAsMs(TIMEOUT, "60s")', 'getTimeAsMs(TIMEOUT, "90s")'), "default is `60s`, the code reads 90s"),
        (("    /// Default: `16m`\n", ""), "spark.shuffled.writerBufferSize: its /// comment needs a meaning"),
        (('= "spark.shuffled.replicas";', '= "spark.shuffled.replicas";' + UNDOCUMENTED), "spark.shuffled.x: its ///"),
    ],
)
def test_the_table_refuses_a_source_that_disagrees_with_itself(
    tmp_path: Path, change: tuple[str, str], says: str
) -> None:
    """A default changed in the code but not in its comment, or a key without a comment, stops the generator."""
    text = spark_settings.SHUFFLED_CONF.read_text()
    assert change[0] in text
    source = tmp_path / "ShuffledConf.java"
    source.write_text(text.replace(change[0], change[1]))
    with pytest.raises(SettingsSourceError, match=re.escape(says)):
        spark_settings.spark_settings(source)


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


def _protocol_sections() -> set[str]:
    headings = re.findall(r"^#{2,3} (\d+(?:\.\d+)?[a-z]?)\.? ", (ROOT / "proto" / "PROTOCOL.md").read_text(), re.M)
    return set(headings)


def test_every_cited_protocol_section_exists() -> None:
    sections = _protocol_sections()
    assert {"6.1", "7.3a", "10.5", "12.4", "16"} <= sections
    cited = {
        f"{path.relative_to(ROOT)}: §{number}"
        for path in _text_files()
        for number in re.findall(r"§(\d+(?:\.\d+)?[a-z]?)", path.read_text(errors="replace"))
        if number not in sections
    }
    assert not cited, f"no such section in proto/PROTOCOL.md: {sorted(cited)}"


def test_image_tags_are_the_package_version() -> None:
    tags = {
        f"{path.relative_to(ROOT)}: {tag}"
        for path in _text_files()
        for tag in re.findall(r"\bshuffled:(\d+\.\d+\.\d+[\w.+-]*)", path.read_text(errors="replace"))
        if tag != __version__
    }
    assert not tags, f"image tags that are not shuffled.__version__ ({__version__}): {sorted(tags)}"


def test_text_describes_behaviour_not_issue_numbers() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in _text_files()
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if re.search(r"\b(?:issue|item)s? \d", line, re.IGNORECASE)
    ]
    assert not found, "say what the code or test does instead:\n" + "\n".join(found)


#: what the build and the benchmarks write: named in the docs, absent from a clean tree
GENERATED = ("client/jvm/build", "benchmarks/results")


def test_every_repository_path_named_exists() -> None:
    """A file or folder of the repository named in code, tests or docs (`shuffled/server/cluster/replica_ring.py`)."""
    pattern = re.compile(r"(?<![\w./-])((?:shuffled|client|tests|benchmarks|docs|proto|deploy|\.ci)/[\w./-]*\w)")
    missing = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in _text_files()
        for name in pattern.findall(path.read_text(errors="replace"))
        if not (ROOT / name).exists() and not name.startswith(GENERATED)
    }
    assert not missing, f"no such path in the repository: {sorted(missing)}"


#: a file named in prose by a path that does not start at the repository's root, or by its name alone
#: (`serving/view_reader.py`, `view_reader.py`); ``.service`` is left out: `spark.shuffle.service` is a setting
_RELATIVE = re.compile(r"(?<![\w./:@$-])(\w[\w.-]*(?:/[\w.-]+)*\.(?:py|java|md|ya?ml|toml|json|proto|conf))(?![\w/-])")
#: what the benchmarks write (benchmarks/results/), named by its file name
GENERATED_NAMES = ("results.json",)


def _prose(path: Path) -> str:
    """The text people read: Markdown whole; in code, docstrings and comments (not strings a test writes to a
    file of its own in a temporary directory)."""
    text = path.read_text(errors="replace")
    if path.suffix == ".md":
        return text
    if path.suffix == ".java":
        return "\n".join(re.findall(r"^\s*(?://+|/?\*+)(.*)$", text, re.MULTILINE))
    if path.suffix != ".py":
        return ""
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docs = [ast.get_docstring(n, clean=False) or "" for n in ast.walk(ast.parse(text)) if isinstance(n, nodes)]
    comments = [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    return "\n".join(docs + comments)


def _repository_files() -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for path in ROOT.rglob("*")
        if path.is_file() and not any(part in SKIPPED or part.startswith(".") for part in path.relative_to(ROOT).parts)
    }


def test_every_file_named_from_elsewhere_exists() -> None:
    """A file named in docs, docstrings or comments by a shorter path (`serving/view_reader.py`, relative to a
    package) or by its name alone (`view_reader.py`) is the end of some file's path in the repository: a renamed
    or removed module leaves no reference behind in prose, where the rooted-path check does not look."""
    files = _repository_files()
    names = {f.rpartition("/")[2] for f in files}
    missing = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in _text_files()
        for name in _RELATIVE.findall(_prose(path))
        if name not in GENERATED_NAMES
        and not name.startswith(GENERATED)
        and not (any(f == name or f.endswith(f"/{name}") for f in files) if "/" in name else name in names)
    }
    assert not missing, f"no such file in the repository: {sorted(missing)}"
