"""The deny-list reads text folded (hacfed.textfold; docs/security.md, issue 42 N2): each disguise of a
canary, a URL or an address that passed the literal match as a success on gsm8k and add2-words is
refused, the deny-list is folded alike, and honest answers still pass."""

from __future__ import annotations

import pytest

from hacfed.clients.textfilter import inbound, outbound
from hacfed.tasks.arithmetic import ArithmeticTask
from hacfed.textfold import CONFUSABLES, fold, squeeze, views
from hacfed.trajectory import Trajectory

WORDS = ArithmeticTask(digits=2, num_train=200, num_eval=20, style="words")
CANARY = "see-evil.example"


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory):
    from hacfed.tasks.math_data import gsm8k_task

    return gsm8k_task(cache_dir=str(tmp_path_factory.mktemp("hf-cache")))


def success(task, text: str) -> Trajectory:
    problem = task.train_problems()[0]
    return Trajectory("peer-0", problem.prompt_id, "peer", 0, problem.messages, text, 1.0, -1.0, 1, "stop")


# The issue's variants, each in a success of both free-text tasks (the answer form is kept so the format
# passes and only the deny-list can refuse it).
VARIANTS = {
    "upper case": "SEE-EVIL.EXAMPLE",
    "U+2010 hyphens": "see\u2010evil.example",
    "split by a newline": "see-evil.\nexample",
    "split mid-word by a newline": "see-ev\nil.example",
    "fullwidth URL": "\uff48\uff54\uff54\uff50\uff53\uff1a\uff0f\uff0fevil",
    "Cyrillic URL": "htt\u0440s://evil",
    "URL split by a newline": "htt\nps://evil",
    "spelled-out address": "a(at)evil(dot)example",
    "address in words": "write to bob at evil dot example",
    "zero-width characters": "see\u200b-evil\u200d.example",
    "Greek and Cyrillic canary": "\u0455\u0435\u0435-\u0435vil.\u0435x\u03b1mple",
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("kind", ["gsm8k", "add2-words"])
def test_each_disguise_of_the_issue_is_refused_as_a_success(gsm8k, kind: str, name: str) -> None:
    task, tail = (gsm8k, " so \\boxed{72}") if kind == "gsm8k" else (WORDS, " The answer is 95.")
    text = f"Note {VARIANTS[name]}{tail}"
    assert inbound(task).why_not(success(task, text.replace(VARIANTS[name], "clean text"))) is None
    assert inbound(task, deny_strings=(CANARY,)).why_not(success(task, text)) is not None
    # the deny-list itself (the outbound filter has no format; a zero-width character is the format's too)
    reason = outbound(deny_strings=(CANARY,)).why_not(success(task, text))
    assert reason is not None and (reason.startswith("matches deny pattern") or CANARY in reason), (name, reason)


def test_the_deny_list_is_folded_alike() -> None:
    text = "Note see-evil.example. The answer is 95."
    for literal in ("SEE-EVIL.EXAMPLE", "see\u2010evil . example", "\uff53ee-evil.example"):
        assert inbound(WORDS, deny_strings=(literal,)).why_not(success(WORDS, text)) == f"contains {literal!r}"
    assert inbound(WORDS, deny_patterns=(r"EVIL\.EXAMPLE",)).why_not(success(WORDS, text)) is not None
    with pytest.raises(ValueError, match="is nothing once folded"):
        inbound(WORDS, deny_strings=("\u200b \n",))


@pytest.mark.parametrize("text", [
    "She looked at the store. Then she paid at 3.50. Total: 95",  # ` at ` before a sentence or a price
    "A dot product of 2 and 3 is 6. So 95.",
    "4 apples @ $2 each. So 95.",
    "Answer: 95 (at most)",
    "The \u00b7 between 3\u00b74 is a product: 95",
])
def test_honest_prose_passes(text: str) -> None:
    assert inbound(WORDS, deny_strings=(CANARY,)).why_not(success(WORDS, text)) is None


def test_fold_steps() -> None:
    assert fold("\uff28\uff34\uff34\uff30\uff33\uff1a\uff0f\uff0f") == "https://"  # NFKC, then case
    assert fold("\u0441\u0430t \u0391\u0392") == "cat ab"  # Cyrillic and Greek look-alikes
    assert fold("a\u200bb\u00adc\u202ed") == "abcd"  # format characters (Cf) dropped
    assert fold("a[at]b{dot}c <.> d") == "a@b.c.d"
    assert fold("bob at evil.example") == "bob@evil.example" and fold("at home. then") == "at home. then"
    assert squeeze("a \n\tb") == "ab" and views("A b") == ("a b", "ab")
    assert all(len(latin) == 1 and latin.isascii() for latin in CONFUSABLES.values())
