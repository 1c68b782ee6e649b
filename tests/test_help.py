"""--help as a person at a terminal reads it (issue 30): short plain descriptions, no reST markup,
no internal file names, every option described; ``lab list`` aligned and never cut mid-sentence."""

from __future__ import annotations

import re

import pytest
import yaml

from recformer.__main__ import DATA_COMMANDS
from recformer.__main__ import main as recformer_main
from recformer.lab.grids import GRIDS_DIR

COMMANDS = [
    ["evaluate"],
    ["export"],
    ["doctor"],
    ["serve"],
    ["lab"],
    ["lab", "run"],
    ["lab", "report"],
    ["lab", "coord-check"],
    ["data"],
    *(["data", name] for name in DATA_COMMANDS),
]


def _help(command: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as done:
        recformer_main([*command, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_is_short_plain_and_describes_every_option(command, capsys):
    text = _help(command, capsys)
    description = text.split("\n\n")[1]  # between the usage and the argument lists
    assert not re.search(r"``|::$|:\w+:`", text, re.M), text  # reST literals, literal blocks, roles
    assert not re.search(r"\b[\w/]+\.py\b", description), description  # an internal file name
    assert len(description.splitlines()) <= 12, description
    options = text.split("options:\n", 1)[1]
    # Every option has words after it: its own line's, or the next line's (a long option name).
    lines = options.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"  (-\S+(?: \S+)*?)(?:  +(\S.*))?$", line)
        if m and not m.group(2):
            assert i + 1 < len(lines) and lines[i + 1].startswith(" " * 10), f"{line!r} has no description"


def test_export_format_is_described(capsys):
    text = " ".join(_help(["export"], capsys).split())
    assert "what to write: torch-export (model.pt2" in text and "onnx (model.onnx" in text


def test_lab_list_is_aligned_and_says_each_description_whole(capsys):
    assert recformer_main(["lab", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    column = lines[0].index("description")
    grids = {p.stem: yaml.safe_load(p.read_text()) for p in sorted(GRIDS_DIR.glob("*.yaml"))}
    starts = [i for i, line in enumerate(lines) if line.split(" ", 1)[0] in grids]
    assert [lines[i].split(" ", 1)[0] for i in starts] == list(grids)
    for k, i in enumerate(starts):
        block = lines[i : starts[k + 1] if k + 1 < len(starts) else len(lines)]
        assert all(line[column - 2 : column] == "  " and line[column] != " " for line in block), block
        said = " ".join(line[column:] for line in block)
        assert said == " ".join(grids[block[0].split(" ", 1)[0]]["description"].split())
