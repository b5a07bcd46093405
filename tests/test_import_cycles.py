"""scripts/import_cycles.py, the check CI runs on each crate's files: it
finds a circle of files that import each other (through `crate::` or
`super::` paths), leaves out a module and its own children, and the
repository's circles are exactly the recorded ones."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("import_cycles", ROOT / "scripts" / "import_cycles.py")
ic = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ic)


def crate(tmp_path: Path, files: dict[str, str]) -> Path:
    src = tmp_path / "src"
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    return src


def test_two_files_importing_each_other_are_a_circle(tmp_path):
    src = crate(
        tmp_path,
        {
            "lib.rs": "mod a; mod b; mod h;\n",
            "a.rs": "use crate::b::Thing;\n",
            "b.rs": "pub struct Thing; fn f() { crate::a::go(); crate::h::x::go(); }\n",
            "h/mod.rs": "mod x;\n",
            "h/x.rs": "// a comment naming crate::a\n",
        },
    )
    # b -> h/x is one way only: h/x is not in the circle (comments are
    # not read).
    assert ic.circles(ic.crate_graph(src)) == [["a.rs", "b.rs"]]


def test_each_further_super_is_one_module_higher(tmp_path):
    src = crate(
        tmp_path,
        {
            "lib.rs": "mod a; mod h;\n",
            "a.rs": "fn f() { crate::h::x::go(); }\n",
            "h/mod.rs": "mod x;\n",
            "h/x.rs": "use super::super::a::Thing;\n",
        },
    )
    assert ic.circles(ic.crate_graph(src)) == [["a.rs", "h/x.rs"]]


def test_a_module_and_its_children_may_import_each_other(tmp_path):
    src = crate(
        tmp_path,
        {
            "lib.rs": "mod p;\n",
            "p/mod.rs": "mod c; use crate::p::c::Y;\n",
            "p/c.rs": "use super::X; pub struct Y;\n",
        },
    )
    assert ic.circles(ic.crate_graph(src)) == []


def test_a_sibling_named_through_super_is_an_import(tmp_path):
    src = crate(
        tmp_path,
        {
            "lib.rs": "mod h;\n",
            "h/mod.rs": "mod one; mod two;\n",
            "h/one.rs": "use super::two::B;\n",
            "h/two.rs": "fn f() { super::one::go(); }\n",
        },
    )
    assert ic.circles(ic.crate_graph(src)) == [["h/one.rs", "h/two.rs"]]


def test_the_repository_has_only_the_recorded_circles():
    assert ic.main() == 0
