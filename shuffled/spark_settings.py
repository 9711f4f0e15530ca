"""The Spark plugin's settings table of README's "Spark" section, read from the plugin's source.

Every `spark.shuffled.*` key is a constant of ``ShuffledConf.java`` whose Markdown comment (``///``)
says what it means, then, in a paragraph of its own, ``Default: ...``. The rows are generated from
those comments, so README and plugin cannot drift apart (a test compares them); where the code reads a
key with a literal default (``conf.get(TIMEOUT, "60s")``), the documented default must be that literal.

``python -m shuffled.spark_settings`` prints the rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .spark_jar import MAIN_SOURCES

SHUFFLED_CONF = MAIN_SOURCES / "io" / "shuffled" / "spark" / "ShuffledConf.java"

_STRING_CONSTANT = re.compile(r'static final String (\w+) = "((?:[^"\\]|\\.)*)";')
#: a key read with a default: conf.get(KEY, "text"), conf.getTimeAsMs(KEY, CONSTANT), ...
_READ_WITH_DEFAULT = re.compile(r"\bconf\.get\w*\(\s*(\w+)\s*,\s*(\"(?:[^\"\\]|\\.)*\"|\w+)\s*\)")
_KEY_LITERAL = re.compile(r'"(spark\.shuffled\.[\w.]+)"')


class SettingsSourceError(ValueError):
    """ShuffledConf.java does not document its settings as this module expects."""


@dataclass(frozen=True)
class SparkSetting:
    key: str
    default: str  # Markdown, as the table shows it
    meaning: str  # Markdown, one line


def spark_settings(source: Path = SHUFFLED_CONF) -> list[SparkSetting]:
    """The `spark.shuffled.*` settings in the order ShuffledConf declares them."""
    text = source.read_text()
    constants = {name: value for name, value in _STRING_CONSTANT.findall(text)}
    code_defaults: dict[str, str] = {}
    for key_name, default in _READ_WITH_DEFAULT.findall(text):
        value = default[1:-1] if default.startswith('"') else constants.get(default, "")
        if value:  # "" and non-string defaults (0, an expression) mean "unset": the comment says what then
            code_defaults[constants.get(key_name, key_name)] = value
    out: list[SparkSetting] = []
    comment: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("///"):
            comment.append(stripped[3:].strip())
            continue
        declared = _STRING_CONSTANT.search(stripped)
        if declared and declared.group(2).startswith("spark.shuffled."):
            out.append(_setting(declared.group(2), comment, code_defaults.get(declared.group(2))))
        comment = []
    _check_every_key_declared(out)
    return out


def _setting(key: str, comment: list[str], code_default: str | None) -> SparkSetting:
    paragraphs = " ".join(line or "\n" for line in comment).split("\n")
    meaning = [" ".join(p.split()) for p in paragraphs if p.strip()]
    if len(meaning) < 2 or not meaning[-1].startswith("Default: "):
        raise SettingsSourceError(f"{key}: its /// comment needs a meaning, then a paragraph 'Default: ...'")
    default = meaning.pop().removeprefix("Default: ")
    if code_default is not None and default != f"`{code_default}`":
        raise SettingsSourceError(f"{key}: the comment says the default is {default}, the code reads {code_default}")
    return SparkSetting(key, default, " ".join(meaning))


def _check_every_key_declared(settings: list[SparkSetting]) -> None:
    """A key spelled out anywhere else in the plugin would be a setting the table does not show."""
    declared = {s.key for s in settings}
    for path in sorted(MAIN_SOURCES.rglob("*.java")):
        for key in _KEY_LITERAL.findall(path.read_text()):
            if key not in declared:
                raise SettingsSourceError(f"{path.name} reads {key}, which ShuffledConf.java does not declare")


def render_markdown() -> str:
    """The `spark.shuffled.*` rows of README's Spark settings table (a test checks README holds exactly these)."""
    return "".join(f"| `{s.key}` | {s.default} | {s.meaning} |\n" for s in spark_settings())


if __name__ == "__main__":
    print(render_markdown(), end="")
