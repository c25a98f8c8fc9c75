"""The chain testbed (hacfed.tasks.chain): worked multi-step arithmetic with a marked final answer."""

from __future__ import annotations

import pytest

from hacfed.models.tokenizers import build_tokenizer
from hacfed.tasks.chain import ChainTask, make_problem, operation_of, verify_final_answer
from hacfed.tasks.registry import load_task


def ids(split):
    return {p.prompt_id for p in split}


def test_worked_solution_and_final_answer():
    p = make_problem("add", (47, 28, 15))
    assert p.messages[0].content == "47+28+15="
    assert p.solution == "47+28=75\n75+15=90\nAnswer: 90" and p.answer == "90"
    q = make_problem("sub", (270, 15, 39))
    assert q.solution == "270-15=255\n255-39=216\nAnswer: 216"
    assert operation_of(p) == "add" and operation_of(q) == "sub"


def test_three_disjoint_seeded_splits_balanced_between_operations():
    task = ChainTask(num_train=400, num_validation=100, num_eval=100)
    train, val, test = ids(task.train_problems()), ids(task.validation_problems()), ids(task.eval_problems())
    assert (len(train), len(val), len(test)) == (400, 100, 100)
    assert not train & val and not train & test and not val & test
    assert sum(operation_of(p) == "add" for p in task.eval_problems()) == 50
    assert ChainTask(num_train=400, num_validation=100, num_eval=100).eval_problems() == task.eval_problems()
    assert ids(ChainTask(seed=1, num_train=400, num_validation=100, num_eval=100).eval_problems()) != test


def test_a_specialists_splits_are_the_mix_restricted_to_its_operation():
    mix = ChainTask(num_train=400, num_validation=100, num_eval=100)
    add = ChainTask(operations=("add",), num_train=400, num_validation=100, num_eval=100)
    # So a specialist's warm-up never sees a validation or test problem of the mix.
    assert ids(add.eval_problems()) == {i for i in ids(mix.eval_problems()) if i.startswith("chain-add")}
    assert ids(add.train_problems()) <= ids(mix.train_problems())
    assert not ids(add.train_problems()) & (ids(mix.eval_problems()) | ids(mix.validation_problems()))


def test_subtraction_chains_never_go_below_zero():
    for p in ChainTask(operations=("sub",), num_train=200, num_validation=10, num_eval=10).train_problems():
        numbers = [int(x) for x in p.messages[0].content.rstrip("=").split("-")]
        running = numbers[0]
        for n in numbers[1:]:
            running -= n
            assert running >= 0
        assert str(running) == p.answer


@pytest.mark.parametrize("kind", ["char", "byte", "bpe"])
def test_responses_are_at_least_20_tokens_for_every_zoo_tokenizer(kind):
    tok = build_tokenizer(kind)
    lengths = [len(tok(p.solution, add_special_tokens=False)["input_ids"]) for p in ChainTask().eval_problems()[:300]]
    assert min(lengths) >= 20


@pytest.mark.parametrize("response, reward", [
    ("47+28=75\n75+15=90\nAnswer: 90", 1.0),
    ("47+28=11\n11+15=99\nAnswer: 90", 1.0),  # only the final answer is checked, as in the paper
    ("Answer: 90", 1.0),
    ("47+28=75\n75+15=90\nAnswer: 90\n", 1.0),
    ("47+28=75\n75+15=90\nAnswer: 91", 0.0),
    ("47+28=75\n75+15=90", 0.0),  # no marked final answer
    ("Answer: 90\nAnswer: 91", 0.0),  # the last line counts
    ("Answer: 90 apples", 0.0),
    ("Answer: " + "9" * 40, 0.0),
    ("x" * 600, 0.0),
])
def test_reward_checks_the_last_answer_line_only(response, reward):
    assert verify_final_answer("90", response).reward == reward


def test_registry_builds_it_and_names_bad_options():
    task = load_task({"kind": "chain", "terms": 3, "operations": ["add"], "num_train": 50, "num_validation": 10, "num_eval": 10})
    assert task.name == "chain3-add" and len(task.eval_problems()) == 5
    with pytest.raises(ValueError, match="operations"):
        load_task({"kind": "chain", "operations": "add"})
    with pytest.raises(ValueError, match="terms must be an int in \\[2, 6\\], got 9"):
        load_task({"kind": "chain", "terms": 9})
    with pytest.raises(ValueError, match="unknown key"):
        load_task({"kind": "chain", "digits": 2})


def test_other_train_adds_a_few_of_the_other_half_to_the_train_split_only():
    kwargs = dict(num_train=400, num_validation=100, num_eval=100)
    pure = ChainTask(operations=("add",), **kwargs)
    mostly = ChainTask(operations=("add",), other_train=20, **kwargs)
    mix = ChainTask(**kwargs)
    extra = ids(mostly.train_problems()) - ids(pure.train_problems())
    assert len(extra) == 20 and all(i.startswith("chain-sub") for i in extra)
    assert extra <= ids(mix.train_problems())  # still the mix's own train problems
    # The specialist's band and every report stay on its own half.
    assert mostly.validation_problems() == pure.validation_problems()
    assert mostly.eval_problems() == pure.eval_problems()
    assert mostly.name == "chain3-add+20" and pure.name == "chain3-add"
    assert load_task({"kind": "chain", "operations": ["add"], "other_train": 20, **kwargs}).train_problems() == mostly.train_problems()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "20", None])
def test_other_train_refuses_bad_values_naming_them(bad):
    with pytest.raises(ValueError, match=repr(bad).replace("(", r"\(")):
        ChainTask(operations=("add",), other_train=bad)


def test_other_train_needs_a_subset_of_the_operations():
    with pytest.raises(ValueError, match="subset"):
        ChainTask(other_train=10)
