"""Real math data (GSM8K / MATH style) from local JSONL or Parquet, scored by `MathVerifier`.

Records are read through `datasets.load_dataset("json" | "parquet", data_files=...)`, one file at a
time so an error can name the file and record. Each record's question becomes one user message (the
`prompt_template`), its answer field is reduced to a canonical gold answer by `answer_format`:

  "gsm8k"            text after the last "####", thousands separators removed ("1,080" -> "1080")
  "boxed"            content of the last \\boxed{...} (MATH solutions)
  "raw"              the whole field, stripped
  "regex:<pattern>"  the last match of <pattern>; its group 1 when the pattern has a group

Prompt ids are `"<name>:" + sha256(question)[:16]`, the same on every machine and run. A question
repeated within a split keeps its first record; a train question that also appears in the eval
files is dropped from train, so the held-out split stays held out.

    task = MathDataTask(name="gsm8k", train_files=("data/gsm8k/train.jsonl",),
                        eval_files=("data/gsm8k/test.jsonl",))
    p = task.train_problems()[0]; task.verify(p, "... \\boxed{72}").reward   # 1.0

The built-in GSM8K task (`gsm8k_task`, selected in a `[task]` table as `kind = "gsm8k"` and in
`hacfed sim --task gsm8k`) reads the copy that ships in `hacfed.data.GSM8K_DIR`, holds the last
200 train questions out as a validation split (for choosing settings), asks for a one-sentence
answer ending in a boxed answer (GSM8K_PROMPT_TEMPLATE), scores the boxed answer or, failing that,
the last number (a small model seldom boxes), and carries its own response budget,
`max_new_tokens` (GSM8K_MAX_NEW_TOKENS, chosen from SmolLM2-135M-Instruct's answer lengths).
`hacfed sim` takes that budget unless `--max-new-tokens` is given; a coordinator takes it unless
its `[sampling] max_new_tokens` is set (hacfed.tasks.registry.task_sampling_defaults).

Sampling stays at the federation's default temperature 1 (no top-k/top-p); at another temperature T,
rollout log-probs, a peer's published `source_logp_sum` and the learner's old and new log-probs are
all of the policy tempered at T (hacfed.rollout.hf, docs/hacpo.md §5). The budget is kept affordable
by the prompt, not by a lower temperature.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

from hacfed.tasks.base import Problem, SplitLookup, Verdict
from hacfed.tasks.math_answers import extract_answer, extract_boxed
from hacfed.tasks.math_verifier import MathVerifier, MathVerifierConfig
from hacfed.tasks.records import check_json_lines
from hacfed.trajectory import ChatMessage

DEFAULT_PROMPT_TEMPLATE = "{question}\nLet's think step by step and output the final answer within \\boxed{}."
# The built-in GSM8K task's prompt and response budget, chosen with bench/gsm8k_budget.py on
# SmolLM2-135M-Instruct (its chat template, the first 48 validation questions, one CPU thread),
# sampled at the federation's temperature 1 (as rollouts are). At temperature 1 this small model's
# answers often derail into text that never ends, and the longer the answer asked for, the more
# often: with "Solve it in a few short steps, then write the final answer as \boxed{N}." 37.5 % of
# answers ran past 320 tokens and 21 % past 640 (median 206), with "Write at most three short lines
# of working" 21 % past 256. Asking for one sentence gives a median of 26 tokens and 6 % past 256
# (8 % past 192, 10 % past 128). None of these prompts gets this model right on GSM8K (0 of 48
# sampled answers with each); a lab with a stronger model sets its own `prompt_template` and `max_new_tokens`.
GSM8K_PROMPT_TEMPLATE = "{question}\nAnswer in one short sentence that ends with the final answer as \\boxed{N}."
GSM8K_MAX_NEW_TOKENS = 256
GSM8K_VALIDATION = 200  # the last train questions, held out for choosing settings
DATA_FORMATS = ("jsonl", "parquet")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_GROUPED = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K's `<<48/2=24>>` calculator annotations
_log = logging.getLogger(__name__)

Extractor = Callable[[str], "str | None"]


@dataclass(frozen=True)
class MathDataTask(SplitLookup):
    """A verifiable math task over local files. Loading is lazy; `hacfed.tasks.registry.load_task` forces it.

    max_train / max_eval keep the first N problems of each split (file order, after de-duplication).
    prompt_template must contain "{question}"; it is substituted literally, so `\\boxed{}` needs
    no escaping. cache_dir is handed to `datasets` (default: its own cache)."""

    name: str = "math"
    train_files: tuple[str, ...] = ()
    eval_files: tuple[str, ...] = ()
    data_format: Literal["jsonl", "parquet"] = "jsonl"
    question_field: str = "question"
    answer_field: str = "answer"
    answer_format: str = "gsm8k"
    max_train: int | None = None
    max_eval: int | None = None
    num_validation: int = 0  # the last N train questions (after de-duplication) become the validation split
    max_new_tokens: int | None = None  # the task's response budget; None: the caller's default
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE
    system_prompt: str | None = None
    cache_dir: str | None = None
    verifier: MathVerifierConfig = field(default_factory=MathVerifierConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(f"MathDataTask.name must match {_NAME.pattern}, got {self.name!r}")
        if self.data_format not in DATA_FORMATS:
            raise ValueError(f"MathDataTask.data_format must be one of {DATA_FORMATS}, got {self.data_format!r}")
        for split in ("train_files", "eval_files"):
            files = getattr(self, split)
            if not isinstance(files, tuple) or not files or not all(isinstance(f, str) and f for f in files):
                raise ValueError(f"MathDataTask.{split} must be a non-empty tuple of paths, got {files!r}")
            for f in files:
                if not Path(f).is_file():
                    raise ValueError(f"MathDataTask.{split}: file not found: {f}")
        for name in ("question_field", "answer_field"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"MathDataTask.{name} must be a non-empty string, got {getattr(self, name)!r}")
        answer_extractor(self.answer_format)  # raises ValueError naming a bad format or regex
        for name in ("max_train", "max_eval", "max_new_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"MathDataTask.{name} must be None or an int >= 1, got {value!r}")
        if isinstance(self.num_validation, bool) or not isinstance(self.num_validation, int) or self.num_validation < 0:
            raise ValueError(f"MathDataTask.num_validation must be an int >= 0, got {self.num_validation!r}")
        if not isinstance(self.prompt_template, str) or "{question}" not in self.prompt_template:
            raise ValueError(f"MathDataTask.prompt_template must contain '{{question}}', got {self.prompt_template!r}")
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise ValueError(f"MathDataTask.system_prompt must be a string or None, got {self.system_prompt!r}")
        if not isinstance(self.verifier, MathVerifierConfig):
            raise ValueError(f"MathDataTask.verifier must be a MathVerifierConfig, got {self.verifier!r}")

    @property
    def _splits(self) -> tuple[tuple[Problem, ...], tuple[Problem, ...]]:
        train, _, held_out = self._three_splits
        return train, held_out

    def validation_problems(self) -> tuple[Problem, ...]:
        """The last `num_validation` train questions, never trained on (empty when 0)."""
        return self._three_splits[1]

    @cached_property
    def _three_splits(self) -> tuple[tuple[Problem, ...], tuple[Problem, ...], tuple[Problem, ...]]:
        eval_all = self._load(self.eval_files)
        eval_ids = {p.prompt_id for p in eval_all}
        train_all = self._load(self.train_files)
        train = [p for p in train_all if p.prompt_id not in eval_ids]
        if len(train) < len(train_all):
            _log.info("%s: dropped %d train questions that are also in the eval files", self.name,
                      len(train_all) - len(train))
        if len(train) <= self.num_validation:
            raise ValueError(f"MathDataTask {self.name}: {len(train)} train problems left after removing eval "
                             f"questions, not more than num_validation {self.num_validation}")
        cut = len(train) - self.num_validation
        return tuple(train[:cut][: self.max_train]), tuple(train[cut:]), tuple(eval_all[: self.max_eval])

    def verify(self, problem: Problem, response: str) -> Verdict:
        return self._verifier.verify(problem.answer, response)

    def answer_of(self, response: str) -> str | None:
        """The answer a response gives, extracted as the verifier extracts it (its `answer_mode`); None for none."""
        extracted = extract_answer(response, self.verifier.answer_mode)
        return extracted.strip() if extracted is not None and extracted.strip() else None

    def start_verify_batch(
        self, items: Sequence[tuple[Problem, str]], budget_s: float | None = None,
    ) -> Callable[[], list[Verdict]]:
        """The coordinator's re-verification of a submission (`MathVerifier.start_concurrently`):
        every response is screened and the math-verify requests are sent now; the function returned
        waits for them and gives `verify` of each (problem, response), in order, or raises
        `VerifyBudgetSpent` when the requests took more than `budget_s` seconds."""
        pairs = [(problem.answer, response) for problem, response in items]
        return self._verifier.start_concurrently(pairs, budget_s)

    @property
    def worker_calls(self) -> int:
        """Requests its verifier sent to a sandboxed math-verify worker so far (for benches and tests)."""
        return self._verifier.worker_calls if "_verifier" in self.__dict__ else 0

    @cached_property
    def _verifier(self) -> MathVerifier:
        return MathVerifier(self.verifier)

    def close(self) -> None:
        """Stop the verifier's worker process (it is also stopped at interpreter exit)."""
        if "_verifier" in self.__dict__:
            self._verifier.close()

    def _load(self, files: tuple[str, ...]) -> list[Problem]:
        """Problems from `files` in order, one per distinct question (the first record wins)."""
        extract = answer_extractor(self.answer_format)
        problems: list[Problem] = []
        seen: set[str] = set()
        for path in files:
            fields = (self.question_field, self.answer_field)
            questions, answers = read_columns(path, self.data_format, fields, self.cache_dir)
            for index, (question, answer) in enumerate(zip(questions, answers), start=1):
                where = f"{path}, record {index}"
                if not isinstance(question, str) or not question.strip():
                    raise ValueError(f"{where}: field {self.question_field!r} must be non-empty text, "
                                     f"got {question!r:.80}")
                answer_text = _answer_text(answer, where, self.answer_field)
                problem = self._make_problem(question.strip(), answer_text, extract, where)
                if problem.prompt_id not in seen:
                    seen.add(problem.prompt_id)
                    problems.append(problem)
        return problems

    def _make_problem(self, question: str, answer_text: str, extract: Extractor, where: str) -> Problem:
        gold = extract(answer_text)
        if gold is None or not gold.strip():
            raise ValueError(
                f"{where}: cannot extract an answer from field {self.answer_field!r} with format "
                f"{self.answer_format!r}: {answer_text[-80:]!r}"
            )
        gold = gold.strip()
        messages = (ChatMessage("user", self.prompt_template.replace("{question}", question)),)
        if self.system_prompt is not None:
            messages = (ChatMessage("system", self.system_prompt), *messages)
        return Problem(
            prompt_id=f"{self.name}:{question_hash(question)}",
            messages=messages,
            answer=gold,
            solution=reference_solution(answer_text, gold, self.answer_format),
        )


def gsm8k_task(**options: Any) -> MathDataTask:
    """The built-in GSM8K task over the shipped files; `options` override MathDataTask's fields
    (name, files and the data format are fixed: use kind "jsonl" for another copy)."""
    from hacfed.data import GSM8K_DIR

    fixed = {"name", "train_files", "eval_files", "data_format", "question_field", "answer_field", "answer_format"}
    taken = sorted(fixed & set(options))
    if taken:
        raise ValueError(f"gsm8k task: {taken} are fixed by the built-in task; use kind 'jsonl' for other files")
    allowed = {f.name for f in fields(MathDataTask)} - fixed
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"gsm8k task: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    defaults: dict[str, Any] = {
        "num_validation": GSM8K_VALIDATION, "max_new_tokens": GSM8K_MAX_NEW_TOKENS,
        "prompt_template": GSM8K_PROMPT_TEMPLATE,
        "verifier": MathVerifierConfig(answer_mode="boxed_or_last_number"),
    }
    return MathDataTask(name="gsm8k", train_files=(str(GSM8K_DIR / "train.jsonl"),),
                        eval_files=(str(GSM8K_DIR / "test.jsonl"),), **{**defaults, **options})


def question_hash(question: str) -> str:
    """First 16 hex digits of sha256 over the stripped question's UTF-8 bytes."""
    return hashlib.sha256(question.strip().encode("utf-8")).hexdigest()[:16]


def answer_extractor(answer_format: str) -> Extractor:
    """A function mapping an answer field to the canonical gold answer (None if absent), by format name."""
    if not isinstance(answer_format, str):
        raise ValueError(f"answer_format must be a string, got {answer_format!r}")
    if answer_format == "gsm8k":
        return _extract_gsm8k
    if answer_format == "boxed":
        return extract_boxed
    if answer_format == "raw":
        return lambda text: text
    if answer_format.startswith("regex:"):
        try:
            pattern = re.compile(answer_format[len("regex:"):])
        except re.error as e:
            raise ValueError(f"answer_format {answer_format!r}: invalid regular expression: {e}") from None
        if pattern.groups > 1:
            raise ValueError(f"answer_format {answer_format!r}: use at most one capturing group")
        return lambda text: _last_match(pattern, text)
    raise ValueError(f"answer_format must be gsm8k, boxed, raw or regex:<pattern>, got {answer_format!r}")


def _extract_gsm8k(text: str) -> str | None:
    if "####" not in text:
        return None
    gold = text.rsplit("####", 1)[1].strip()
    return gold.replace(",", "") if _GROUPED.fullmatch(gold) else gold


def _last_match(pattern: re.Pattern[str], text: str) -> str | None:
    last = None
    for last in pattern.finditer(text):
        pass
    if last is None:
        return None
    return last.group(1) if pattern.groups else last.group(0)


def reference_solution(answer_text: str, gold: str, answer_format: str) -> str:
    """A completion for supervised warm-up that ends in the form the verifier scores (a \\boxed{} answer)."""
    final = f"The final answer is \\boxed{{{gold}}}."
    if answer_format == "boxed":
        return answer_text.strip()
    if answer_format == "gsm8k":
        reasoning = _CALCULATOR.sub("", answer_text.rsplit("####", 1)[0]).strip()
        return f"{reasoning}\n{final}" if reasoning else final
    if answer_format == "raw":
        return final
    return f"{answer_text.strip()}\n{final}"


def _answer_text(value: object, where: str, field_name: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    raise ValueError(f"{where}: field {field_name!r} must be text or a number, got {value!r:.80}")


def read_columns(path: str, data_format: str, fields: tuple[str, ...], cache_dir: str | None) -> tuple[list[Any], ...]:
    """The named columns of one JSONL/Parquet file, read through `datasets`; ValueError for any user mistake."""
    import datasets  # heavy (pyarrow, pandas): imported only when data is actually read
    import pyarrow

    if not Path(path).is_file():
        raise ValueError(f"data file not found: {path}")
    if Path(path).stat().st_size == 0:
        raise ValueError(f"data file is empty: {path}")
    builder = "json" if data_format == "jsonl" else "parquet"
    if data_format == "jsonl":
        check_json_lines(path)  # a bad line named by its number from 1, not pyarrow's 0-based row
    bars_were_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its errors come back as the one line below
    try:
        dataset = datasets.load_dataset(builder, data_files=[str(path)], split="train", cache_dir=cache_dir)
    except (datasets.exceptions.DatasetGenerationError, pyarrow.ArrowException) as e:
        cause = e.__cause__ if e.__cause__ is not None else e
        raise ValueError(f"{path}: cannot be read as {data_format}: {cause}") from e
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars_were_on:
            datasets.enable_progress_bars()
    missing = [f for f in fields if f not in dataset.column_names]
    if missing:
        raise ValueError(f"{path}: missing field(s) {missing}; the records have {dataset.column_names}")
    if len(dataset) == 0:
        raise ValueError(f"data file has no records: {path}")
    return tuple(list(dataset[f]) for f in fields)
