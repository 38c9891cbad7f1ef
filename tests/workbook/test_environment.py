"""environment.yml describes the same environment as requirements.txt."""
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _name(spec: str) -> str:
    return re.split(r"[<>=!~;\[ ]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-")


def requirement_names() -> set[str]:
    lines = [l.split("#")[0].strip() for l in (ROOT / "requirements.txt").read_text().splitlines()]
    return {_name(l) for l in lines if l}


def environment_names() -> set[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["name"] == "minimax-lab"
    names = set()
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            names |= {_name(d) for d in dep.get("pip", []) if not d.startswith("-e")}
        elif not _name(dep) in ("python", "pip"):
            names.add(_name(dep))
    return names


def test_environment_matches_requirements():
    assert requirement_names() == environment_names()


def test_name_parser_sees_differences():
    assert _name("numpy>=1.26,<2.3") == "numpy" and _name("minimax-lab[notebooks]") == "minimax-lab"
