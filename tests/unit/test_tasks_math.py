"""MathDataTask (local JSONL/Parquet through `datasets`), answer extraction, the registry, and real GSM8K."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hacfed.data import GSM8K_DIR as GSM8K
from hacfed.tasks.arithmetic import ArithmeticTask
from hacfed.tasks.math_data import DEFAULT_PROMPT_TEMPLATE, MathDataTask, answer_extractor, question_hash
from hacfed.tasks.math_verifier import MathVerifier, MathVerifierConfig
from hacfed.tasks.registry import load_task


def _write_jsonl(path: Path, records: list[dict[str, object]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    train = [{"question": f"What is {i} plus {i}?", "answer": f"{i}+{i}=<<{i}+{i}={2 * i}>>{2 * i}\n#### {2 * i:,}"}
             for i in range(1, 8)]
    train.append({"question": "What is 1 plus 1?", "answer": "#### 999"})  # repeated question: first record wins
    train.append({"question": "Held out?", "answer": "#### 5"})  # also in eval: dropped from train
    held_out = [{"question": "Held out?", "answer": "#### 5"}, {"question": "Half of 1?", "answer": "#### 0.5"}]
    return {"train": _write_jsonl(tmp_path / "train.jsonl", train),
            "eval": _write_jsonl(tmp_path / "test.jsonl", held_out),
            "cache": str(tmp_path / "cache")}


def _task(files: dict[str, str], **kwargs: object) -> MathDataTask:
    options: dict[str, object] = {"name": "toy", "train_files": (files["train"],), "eval_files": (files["eval"],),
                                  "cache_dir": files["cache"]}
    options.update(kwargs)
    return MathDataTask(**options)  # type: ignore[arg-type]


def test_jsonl_task_builds_problems_with_stable_ids_and_default_prompt(files: dict[str, str]) -> None:
    task = _task(files)
    train, held_out = task.train_problems(), task.eval_problems()
    assert [p.answer for p in train] == ["2", "4", "6", "8", "10", "12", "14"]  # duplicate + eval question dropped
    assert [p.answer for p in held_out] == ["5", "0.5"]
    first = train[0]
    assert first.prompt_id == f"toy:{question_hash('What is 1 plus 1?')}" and len(first.prompt_id) == 4 + 16
    assert first.messages[0].role == "user"
    assert first.messages[0].content == (
        "What is 1 plus 1?\nLet's think step by step and output the final answer within \\boxed{}.")
    assert first.solution == "1+1=2\nThe final answer is \\boxed{2}."  # calculator annotation removed
    assert task.problem(first.prompt_id) is first
    assert _task(files).train_problems() == train  # same files -> same ids and order
    ids = [p.prompt_id for p in train + held_out]
    assert len(set(ids)) == len(ids)


def test_limits_template_and_system_prompt(files: dict[str, str]) -> None:
    task = _task(files, max_train=3, max_eval=1, prompt_template="Q: {question} {x}", system_prompt="Be brief.")
    assert len(task.train_problems()) == 3 and len(task.eval_problems()) == 1
    messages = task.train_problems()[0].messages
    assert [m.role for m in messages] == ["system", "user"]
    assert messages[1].content == "Q: What is 1 plus 1? {x}"  # literal substitution, other braces kept
    assert DEFAULT_PROMPT_TEMPLATE.endswith("within \\boxed{}.")


def test_verify_goes_through_the_math_verifier(files: dict[str, str]) -> None:
    task = _task(files)
    try:
        problem = task.train_problems()[4]  # gold 10
        assert task.verify(problem, "so \\boxed{10}").reward == 1.0
        assert task.verify(problem, "so \\boxed{11}").reward == 0.0
        assert task.verify(problem, problem.solution).reward == 1.0
        assert task.verify(problem, "10").reason == "no \\boxed{} answer found"
    finally:
        task.close()


def test_parquet_with_custom_fields_and_boxed_answers(tmp_path: Path) -> None:
    import datasets

    rows = [{"problem": "Simplify 2/4.", "solution": "Divide: $\\boxed{\\frac{1}{2}}$"},
            {"problem": "1+1?", "solution": "It is \\boxed{2}."}]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))
    datasets.Dataset.from_list(rows[1:]).to_parquet(str(tmp_path / "test.parquet"))
    task = load_task({"kind": "parquet", "name": "mathy", "train_files": ["train.parquet"],
                      "eval_files": ["test.parquet"],
                      "question_field": "problem", "answer_field": "solution", "answer_format": "boxed",
                      "cache_dir": str(tmp_path / "cache")}, base_dir=tmp_path)
    assert isinstance(task, MathDataTask)
    assert [p.answer for p in task.train_problems()] == ["\\frac{1}{2}"]  # "1+1?" is held out
    assert task.train_problems()[0].solution == rows[0]["solution"]
    assert task.eval_problems()[0].prompt_id.startswith("mathy:")


@pytest.mark.parametrize(
    ("answer_format", "text", "gold"),
    [
        ("gsm8k", "work\n#### 72", "72"),
        ("gsm8k", "#### 1,080", "1080"),
        ("gsm8k", "#### -7", "-7"),
        ("gsm8k", "a #### 1 #### 2", "2"),
        ("gsm8k", "no marker", None),
        ("boxed", "x \\boxed{1} then \\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),
        ("boxed", "none here", None),
        ("raw", " 42 ", " 42 "),
        ("regex:answer is (\\S+)", "the answer is 3, no, the answer is 4", "4"),
        ("regex:\\d+", "3 then 17", "17"),
        ("regex:answer is (\\S+)", "nothing", None),
    ],
)
def test_answer_formats(answer_format: str, text: str, gold: str | None) -> None:
    assert answer_extractor(answer_format)(text) == gold


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"train_files": ("nope.jsonl",)}, "file not found: nope.jsonl"),
        ({"train_files": ()}, "train_files must be a non-empty tuple"),
        ({"answer_format": "latex"}, "answer_format must be gsm8k, boxed, raw or regex"),
        ({"answer_format": "regex:("}, "invalid regular expression"),
        ({"prompt_template": "no placeholder"}, "must contain '{question}'"),
        ({"name": "bad name!"}, "MathDataTask.name"),
        ({"max_train": 0}, "max_train must be None or an int >= 1"),
        ({"data_format": "csv"}, "data_format must be one of"),
    ],
)
def test_bad_options_are_clear_value_errors(files: dict[str, str], kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", "\\(").replace("{", "\\{").replace("}", "\\}")):
        _task(files, **kwargs)


def test_missing_field_unextractable_answer_and_bad_json_name_the_file_and_record(
        tmp_path: Path, files: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=r"missing field\(s\) \['prompt'\]"):
        _task(files, question_field="prompt").train_problems()
    bad = _write_jsonl(tmp_path / "bad.jsonl",
                       [{"question": "a?", "answer": "#### 1"}, {"question": "b?", "answer": "no marker"}])
    with pytest.raises(ValueError, match=r"bad\.jsonl, record 2: cannot extract an answer from field 'answer'"):
        _task(files, train_files=(bad,)).train_problems()
    nulls = _write_jsonl(tmp_path / "nulls.jsonl", [{"question": "a?", "answer": None}])
    with pytest.raises(ValueError, match=r"nulls\.jsonl, record 1: field 'answer' must be text or a number"):
        _task(files, train_files=(nulls,)).train_problems()
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "a?", "answer": "#### 1"}\n{not json\n')
    with pytest.raises(ValueError, match=r"broken\.jsonl, line 2: not valid JSON"):
        _task(files, train_files=(str(broken),)).train_problems()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="data file is empty"):
        _task(files, train_files=(str(empty),)).train_problems()


# ----------------------------------------------------------------------------- registry


def test_registry_builds_arithmetic_and_rejects_unknowns(files: dict[str, str]) -> None:
    task = load_task({"kind": "arithmetic", "digits": 2, "operators": "+", "seed": 0, "num_train": 40, "num_eval": 5})
    assert task == ArithmeticTask(digits=2, operators="+", seed=0, num_train=40, num_eval=5)
    with pytest.raises(ValueError, match="unknown kind 'csv'"):
        load_task({"kind": "csv"})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['digit', 'sed'\]"):
        load_task({"kind": "arithmetic", "digit": 2, "sed": 1})
    with pytest.raises(ValueError, match="'digits' must be int"):
        load_task({"kind": "arithmetic", "digits": "2"})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['question_key'\]"):
        load_task({"kind": "jsonl", "train_files": [files["train"]], "eval_files": [files["eval"]],
                   "question_key": "q"})
    with pytest.raises(ValueError, match="'eval_files' is required"):
        load_task({"kind": "jsonl", "train_files": [files["train"]]})
    with pytest.raises(ValueError, match=r"verifier.sandbox'?: unknown key\(s\) \['timeout'\]"):
        load_task({"kind": "jsonl", "train_files": [files["train"]], "eval_files": [files["eval"]],
                   "verifier": {"sandbox": {"timeout": 3}}})


def test_registry_passes_verifier_settings(files: dict[str, str]) -> None:
    task = load_task({"kind": "jsonl", "name": "toy", "train_files": files["train"], "eval_files": [files["eval"]],
                      "cache_dir": files["cache"], "max_train": 2,
                      "verifier": {"answer_mode": "last_number", "sandbox": {"timeout_s": 3.0}}})
    assert isinstance(task, MathDataTask)
    assert task.verifier.answer_mode == "last_number" and task.verifier.sandbox.timeout_s == 3.0
    assert task.verify(task.train_problems()[1], "so it is 4.").reward == 1.0  # no \boxed needed in this mode


def test_registry_never_imports_torch(files: dict[str, str]) -> None:
    script = textwrap.dedent(f"""
        import sys
        from hacfed.tasks.registry import load_task
        arith = load_task({{"kind": "arithmetic", "num_train": 20, "num_eval": 5}})
        assert arith.verify(arith.train_problems()[0], arith.train_problems()[0].answer).reward == 1.0
        task = load_task({{"kind": "jsonl", "train_files": [{files["train"]!r}], "eval_files": [{files["eval"]!r}],
                          "cache_dir": {files["cache"]!r}}})
        p = task.eval_problems()[1]
        assert task.verify(p, "\\\\boxed{{\\\\frac{{1}}{{2}}}}").reward == 1.0  # through the sandboxed worker
        task.close()
        assert "torch" not in sys.modules, "registry pulled in torch"
        assert "sympy" not in sys.modules and "math_verify" not in sys.modules, "math-verify ran in the caller"
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"


# ----------------------------------------------------------------------------- real GSM8K


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory: pytest.TempPathFactory) -> MathDataTask:
    assert (GSM8K / "train.jsonl").is_file(), f"GSM8K ships with the package, expected in {GSM8K}"
    task = load_task({"kind": "jsonl", "name": "gsm8k", "train_files": ["train.jsonl"], "eval_files": ["test.jsonl"],
                      "question_field": "question", "answer_field": "answer", "answer_format": "gsm8k",
                      "cache_dir": str(tmp_path_factory.mktemp("hf-cache"))}, base_dir=GSM8K)
    assert isinstance(task, MathDataTask)
    return task


def test_gsm8k_loads_with_its_first_gold_72(gsm8k: MathDataTask) -> None:
    assert len(gsm8k.train_problems()) == 7473 and len(gsm8k.eval_problems()) == 1319
    first = gsm8k.train_problems()[0]
    assert first.answer == "72"
    assert first.messages[0].content.startswith("Natalia sold clips to 48 of her friends")


def test_gsm8k_gold_answers_score_one_and_wrong_answers_zero(gsm8k: MathDataTask) -> None:
    rng = random.Random(0)
    sample = rng.sample(gsm8k.train_problems(), 200) + rng.sample(gsm8k.eval_problems(), 200)
    for p in sample:
        right = gsm8k.verify(p, f"Some reasoning. The answer is \\boxed{{{p.answer}}}.")
        assert right.reward == 1.0, (p.prompt_id, p.answer, right)
        assert gsm8k.verify(p, p.solution).reward == 1.0, (p.prompt_id, p.solution)
        wrong = gsm8k.verify(p, f"The answer is \\boxed{{{int(p.answer) + 1}}}.")
        assert wrong.reward == 0.0, (p.prompt_id, wrong)


def test_gsm8k_golds_through_math_verify_in_the_sandbox(gsm8k: MathDataTask) -> None:
    sample = random.Random(1).sample(gsm8k.train_problems() + gsm8k.eval_problems(), 40)
    with MathVerifier(MathVerifierConfig(numeric_fast_path=False)) as verifier:
        right = verifier.verify_many([(p.answer, f"\\boxed{{\\$ {int(p.answer):,}}}") for p in sample])
        wrong = verifier.verify_many([(p.answer, f"\\boxed{{{int(p.answer) - 1}}}") for p in sample])
        assert verifier.worker_calls == 2 * len({p.answer for p in sample})  # once per distinct (gold, answer)
    assert all(v.reward == 1.0 for v in right), [v for v in right if v.reward != 1.0]
    assert all(v.reward == 0.0 and v.reason == "wrong answer" for v in wrong)
