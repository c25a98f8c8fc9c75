"""`hacfed bench modes`: each result on one page, when several matrices share runs (pages.py)."""

from __future__ import annotations

import json
from pathlib import Path

from hacfed.tools.experiments.matrix import load_matrix
from hacfed.tools.experiments.pages import anchor, command_options
from hacfed.tools.experiments.report import BEGIN, END, ReportPaths, write_report
from hacfed.tools.experiments.runner import runs_of
from tests.unit.test_bench_modes import _rows, _write_complete

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("results.md", "baselines.md", "three-labs.md")  # the pages bench/*.toml write, sharing runs/modes
SKIPPED_FIRST_CELLS = {"mode", "agent", "start (round 0)"}  # header rows, and the start row every table repeats


def generated_rows(document: str) -> set[tuple[str, str]]:
    """(setting, table row) of every result row in the generated section (start and header rows aside)."""
    section = document.split(BEGIN, 1)[1].split(END, 1)[0]
    rows, heading = set(), None
    for line in section.splitlines():
        if line.startswith("### "):
            heading = line[4:].split(":", 1)[0].strip()
        elif heading and line.startswith("| ") and line[2:].split(" | ", 1)[0] not in SKIPPED_FIRST_CELLS:
            rows.add((heading, line))
    return rows


def repeated_rows(pages: dict[str, str]) -> list[str]:
    """'setting: row (page, page)' for each result row printed on more than one page."""
    where: dict[tuple[str, str], list[str]] = {}
    for name, text in pages.items():
        for row in generated_rows(text):
            where.setdefault(row, []).append(name)
    return sorted(f"{s}: {row} ({', '.join(names)})" for (s, row), names in where.items() if len(names) > 1)


def test_the_shipped_pages_print_each_result_once():
    pages = {name: (ROOT / "docs" / name).read_text(encoding="utf-8") for name in PAGES}
    assert all(len(generated_rows(text)) > 20 for text in pages.values())
    problems = repeated_rows(pages)
    assert not problems, "results printed on two pages:\n" + "\n".join(problems)


MATRIX_HEAD = """[defaults]
task = "add2"
rounds = 4
lr = 5e-5
eval_every = 2
eval_problems = 50
eval_split = "test"
prompts_per_round = 16
group_size = 8
seeds = SEEDS
modes = MODES
baseline = "BASELINE"
"""

HEAD = MATRIX_HEAD.replace("SEEDS", "[0, 1, 2]").replace("MODES", '["naive", "gspo2"]').replace(
    "BASELINE", "gspo2") + """
[settings.pair]
agents = ["m1", "m2"]
description = "the pair"

[settings.trio]
agents = ["m1", "m2", "m3"]
modes = ["naive"]
baseline = "naive"

[settings.own]
agents = ["m1", "m3"]

[[comparisons]]
agent = "m1"
mode = "naive"
settings = ["trio", "pair"]

[[comparisons]]
agent = "m1"
mode = "naive"
settings = ["trio", "own"]
"""
# The pair's naive and gspo2 runs again, with one mode more: the same runs, so printed by the head page.
EXTRA = MATRIX_HEAD.replace("SEEDS", "[0, 1, 2]").replace("MODES", '["naive", "gspo2", "gspo"]').replace(
    "BASELINE", "gspo2") + '\n[settings.pair]\nagents = ["m1", "m2"]\n'
# trio and one comparison over more seeds (so printed here); the pair with another baseline (its own cells).
MORE = MATRIX_HEAD.replace("SEEDS", "[0, 1, 2, 3, 4]").replace("MODES", '["naive"]').replace(
    "BASELINE", "naive") + """
[settings.trio]
agents = ["m1", "m2", "m3"]

[settings.pair]
agents = ["m1", "m2"]

[[comparisons]]
agent = "m1"
mode = "naive"
settings = ["trio", "pair"]
"""
EXTRA_MD, MORE_MD = "extra" + ".md", "more" + ".md"  # pages of the test only (assembled: not docs to cite)
COMMANDS = {
    "head": "hacfed bench modes --matrix head.toml --out runs",
    "extra": f"hacfed bench modes --matrix extra.toml --out runs --results docs/{EXTRA_MD} --img-dir docs/img/extra",
    "more": f"hacfed bench modes --matrix more.toml --out runs --results docs/{MORE_MD} --img-dir docs/img/more",
}
PAGE_OF = {"head": "docs/results.md", "extra": f"docs/{EXTRA_MD}", "more": f"docs/{MORE_MD}"}


def _final(setting: str, mode: str, seed: int, agent: str) -> float:
    """One number per run and agent, whichever matrix reads it."""
    mode_gain = {"naive": 0.05, "gspo2": 0.0, "gspo": 0.02}[mode]
    return round(0.3 + 0.01 * seed + mode_gain + 0.03 * int(agent[1:]) + 0.005 * len(setting), 4)


def _report(name: str) -> str:
    options = command_options(COMMANDS[name])
    matrix = load_matrix(options["--matrix"])
    page = Path(PAGE_OF[name])
    write_report(matrix, Path("runs"), ReportPaths(page, Path(options.get("--img-dir", "docs/img")), COMMANDS[name]))
    return page.read_text()


def test_shared_runs_are_printed_on_one_page(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("docs").mkdir()
    for name, text in (("head", HEAD), ("extra", EXTRA), ("more", MORE)):
        Path(f"{name}.toml").write_text(text)
        Path(PAGE_OF[name]).write_text(f"# {name}\n")
        for setting in load_matrix(f"{name}.toml").settings:
            for run in runs_of(setting):
                finals = {a: _final(setting.name, run.mode, run.seed, a) for a in run.agent_ids}
                _write_complete(run, Path("runs"), _rows(list(run.agent_ids), run.mode, run.seed, finals))
    for name in ("extra", "more", "head"):  # a page learns of the others from their generated sections
        _report(name)
    pages = {name: _report(name) for name in ("head", "extra", "more")}  # the order does not matter
    assert pages == {name: Path(PAGE_OF[name]).read_text() for name in pages} and pages == {
        name: _report(name) for name in ("more", "head", "extra")}
    assert not repeated_rows(pages)
    head, extra, more = pages["head"], pages["extra"], pages["more"]
    # the pair's shared modes stay with the default page; extra prints only the mode it adds
    assert "| naive | 128 |" in head and "| gspo2 (baseline) | 256 |" in head
    assert ("Not repeated here: naive and gspo2 (baseline) of this setting; [results.md](results.md#pair-the-pair) "
            "prints them from the same runs.") in extra
    extra_pair = extra.split("### pair", 1)[1]
    assert "| gspo | 128 |" in extra_pair and "| naive |" not in extra_pair and "| gspo2 (baseline) |" not in extra_pair
    assert "| gspo | " in extra_pair.split("Paired difference", 1)[1]  # its difference against gspo2 is here
    # trio over 5 seeds on the more page covers the head's 3: a link instead of tables, no PNG
    head_trio = head.split("### trio", 1)[1].split("### own", 1)[0]
    assert "| naive" not in head_trio and not Path("docs/img/modes-trio.png").exists()
    assert (f"Not repeated here: naive (baseline) of this setting; [{MORE_MD}]({MORE_MD}#trio) prints it over seeds "
            "0, 1, 2, 3, 4, which include these runs.") in head_trio
    assert "| naive (baseline) | 128 | " in more.split("### trio", 1)[1]
    # the pair with another baseline is other cells: printed by both pages
    assert "### pair\n" in more and "Not repeated" not in more
    # comparisons: trio vs pair over 5 seeds on the more page; trio vs own only on the head page
    assert (f"Not repeated here: m1 naive trio vs pair; [{MORE_MD}]({MORE_MD}#comparisons-across-settings) "
            "prints it over seeds 0, 1, 2, 3, 4, which include these runs.") in head
    assert "| m1 | naive | trio vs own |" in head and "| m1 | naive | trio vs pair |" not in head
    assert "| m1 | naive | trio vs pair |" in more
    # a setting printed elsewhere in full needs no runs here
    for run in runs_of(load_matrix("head.toml").setting("trio")):
        run.metrics_path(Path("runs")).unlink()
    assert _report("head").split("### trio", 1)[1].split("### own", 1)[0] == head_trio


def test_a_repeated_row_is_found():
    page = f"{BEGIN}\n### pair: x\n\n| mode | m1 |\n|---|---|\n| start (round 0) | 0.3 |\n| naive | 0.5 |\n{END}\n"
    assert repeated_rows({"a": page, "b": page.replace("0.3", "0.2")}) == ["pair: | naive | 0.5 | (a, b)"]
    assert repeated_rows({"a": page, "b": page.replace("### pair", "### other")}) == []


def test_anchor_and_command():
    assert anchor("char-bpe: model heterogeneity: Llama with a character-level tokenizer, Qwen2 with a BPE one") == (
        "char-bpe-model-heterogeneity-llama-with-a-character-level-tokenizer-qwen2-with-a-bpe-one")
    assert anchor("x (peers_per_prompt = 1, ~2.5 %)") == "x-peers_per_prompt--1-25-"
    assert command_options("hacfed bench modes --matrix m.toml --out runs") == {"--matrix": "m.toml", "--out": "runs"}
    assert command_options("cmd") is None and command_options("hacfed bench modes --out runs") is None
    assert json.loads(json.dumps(command_options(COMMANDS["extra"])))["--results"] == f"docs/{EXTRA_MD}"
