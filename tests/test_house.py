"""The house's bounds (issues 17 and 30), so they cannot slip again unnoticed: no function over 60
lines, no file over 600, and no import circle between recformer's modules, counted by
``bench/code_stats.py`` (the script that prints the figures)."""

from __future__ import annotations

from tests.conftest import load_bench

code_stats = load_bench("code_stats")


def test_no_function_over_60_lines_and_no_file_over_600():
    stats = code_stats.stats(code_stats.sources(None))
    assert stats["functions_over_60"] == [], "split these functions: " + ", ".join(stats["functions_over_60"])
    assert stats["files_over_600"] == [], "split these files: " + ", ".join(stats["files_over_600"])


def test_no_import_circle_between_recformer_modules():
    circles = code_stats.import_circles(code_stats.sources(None))
    assert circles == [], "modules that import one another: " + "; ".join(" <-> ".join(c) for c in circles)


def test_the_circle_finder_sees_every_kind_of_import():
    """A circle closed by a function-level import, one under TYPE_CHECKING and one through an
    importlib table are each found; two modules that import a third are no circle."""
    files = {
        "recformer/a.py": "import recformer.b\n",
        "recformer/b.py": "def f():\n    from recformer import a\n",
        "recformer/c.py": "if TYPE_CHECKING:\n    from recformer.d import X\n",
        "recformer/d.py": "from recformer.c import Y\n",
        "recformer/e.py": "TOOLS = {'f': 'recformer.f'}\n",
        "recformer/f.py": "from recformer.e import version\n",
        "recformer/g.py": "import recformer.h\n",
        "recformer/i.py": "import recformer.h\n",
        "recformer/h.py": "X = 1\n",
    }
    assert code_stats.import_circles(files) == [
        ["recformer.a", "recformer.b"],
        ["recformer.c", "recformer.d"],
        ["recformer.e", "recformer.f"],
    ]
