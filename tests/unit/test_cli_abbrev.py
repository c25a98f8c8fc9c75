"""Every command line refuses abbreviated flags: `hacfed demo --round 3` must be an error, not `--rounds 3`.

argparse accepts any unambiguous prefix of a long flag unless allow_abbrev=False; a typo then silently
sets another option. The walk covers hacfed, hacfed-server and hacfed-client with all their subcommands;
the source scan covers the parsers built inside functions (python -m entry points).
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from hacfed.clients import enrol
    from hacfed.clients import main as client_main
    from hacfed.server import admin, onboarding
    from hacfed.server import main as server_main
    from hacfed.tools import cli

    return {"hacfed": cli.build_parser(), "hacfed-server": server_main.build_parser(),
            "hacfed-server onboarding": onboarding.build_parser(), "hacfed-server admin": admin.build_parser(),
            "hacfed-client": client_main.build_parser(), "hacfed-client keys": enrol.build_parser()}


def _walk(name: str, parser: argparse.ArgumentParser):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _walk(f"{name} {sub_name}", sub)


def test_every_parser_and_subparser_refuses_abbreviations():
    seen = []
    for top, parser in _parsers().items():
        for name, p in _walk(top, parser):
            seen.append(name)
            assert p.allow_abbrev is False, f"{name} accepts abbreviated flags"
    assert "hacfed demo" in seen and "hacfed bench modes" in seen and "hacfed-server onboarding certs init" in seen
    assert len(seen) >= 14, seen


@pytest.mark.parametrize("argv", [["demo", "--round", "3"], ["sim", "--round", "3"], ["report", "runs", "--ou", "x"],
                                  ["models", "build", "tiny-llama", "--forc"]])
def test_hacfed_refuses_a_prefix_of_a_flag_in_one_line(argv, capsys):
    from hacfed.tools.cli import build_parser

    with pytest.raises(SystemExit) as info:  # parse only: an accepted prefix must not start a demo
        build_parser().parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"unrecognized arguments: {argv[-2] if argv[-1] != '--forc' else '--forc'}" in err, err
    assert err.count("\n") == 1, err


@pytest.mark.parametrize("argv", [["--config", "x.toml", "--state", "s"], ["register", "--state", "s", "f.txt"],
                                  ["purge", "--state", "s", "--participant", "a", "--from-round", "1"]])
def test_hacfed_server_refuses_a_prefix_of_a_flag(argv, capsys):
    from hacfed.server.main import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "--state" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--model", "tiny-llama", "--part", "lab-a"], ["keys", "--state", "s",
                                                                               "--participant-id", "a"],
                                  ["replay", "--exclude", "b", "--from", "1"]])
def test_hacfed_client_refuses_a_prefix_of_a_flag(argv, capsys):
    from hacfed.clients.main import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err or "required" in err, err


def _argument_parser_calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "ArgumentParser":
                yield node


def test_every_argument_parser_in_the_source_refuses_abbreviations():
    """Parsers built inside functions of the installed package (python -m hacfed.clients.distributed,
    hacfed.tools.gpu_check): each plain argparse.ArgumentParser(...) passes allow_abbrev=False
    (OneLineArgumentParser does by default)."""
    files = [p for top in ("hacfed", "server", "clients") for p in (REPO / top).rglob("*.py")]
    calls = 0
    for path in files:
        for call in _argument_parser_calls(path):
            calls += 1
            kw = {k.arg: k.value for k in call.keywords}
            assert "allow_abbrev" in kw and isinstance(kw["allow_abbrev"], ast.Constant) \
                and kw["allow_abbrev"].value is False, f"{path.relative_to(REPO)}:{call.lineno} allows abbreviations"
    assert calls >= 2, calls
