"""The chain testbed (hacfed.tasks.chain): worked multi-step arithmetic with a marked final answer."""

from __future__ import annotations

import pytest

from hacfed.models.tokenizers import build_tokenizer
from hacfed.tasks.chain import ChainTask, make_problem, notation_of, operation_of, verify_final_answer
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
    task = load_task(
        {"kind": "chain", "terms": 3, "operations": ["add"], "num_train": 50, "num_validation": 10, "num_eval": 10}
    )
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
    chosen = load_task({"kind": "chain", "operations": ["add"], "other_train": 20, **kwargs})
    assert chosen.train_problems() == mostly.train_problems()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "20", None])
def test_other_train_refuses_bad_values_naming_them(bad):
    with pytest.raises(ValueError, match=repr(bad).replace("(", r"\(")):
        ChainTask(operations=("add",), other_train=bad)


def test_other_train_needs_a_half_left_out():
    with pytest.raises(ValueError, match="subset of the operations or of the notations"):
        ChainTask(notations=("sym", "word"), other_train=10)


def test_word_notation_asks_the_same_chain_in_words_with_the_same_worked_solution():
    p, q = make_problem("add", (47, 28, 15), "word"), make_problem("sub", (270, 15, 39), "word")
    assert p.messages[0].content == "What is 47 plus 28 plus 15?"
    assert q.messages[0].content == "What is 270 minus 15 minus 39?"
    assert p.solution == make_problem("add", (47, 28, 15)).solution and p.answer == "90"
    assert (operation_of(p), notation_of(p)) == ("add", "word")
    assert (operation_of(q), notation_of(q)) == ("sub", "word")
    assert notation_of(make_problem("sub", (270, 15, 39))) == "sym"
    assert p.prompt_id != make_problem("add", (47, 28, 15)).prompt_id


def test_notations_change_how_prompts_are_written_never_which_problems_a_split_holds():
    kwargs = dict(num_train=400, num_validation=100, num_eval=100)
    sym, word, mix = (ChainTask(notations=n, **kwargs) for n in (("sym",), ("word",), ("sym", "word")))
    assert sym.eval_problems() == ChainTask(**kwargs).eval_problems()  # the default is unchanged

    def arithmetic(split):
        return [p.solution for p in split]

    for split in ("train_problems", "validation_problems", "eval_problems"):
        a, b, c = (getattr(t, split)() for t in (sym, word, mix))
        assert arithmetic(a) == arithmetic(b) == arithmetic(c), split
        assert {notation_of(p) for p in b} == {"word"}
    # The mix alternates in pairs, so each notation holds both operations, half and half.
    halves = [(notation_of(p), operation_of(p)) for p in mix.eval_problems()]
    assert halves[:4] == [("sym", "add"), ("sym", "sub"), ("word", "add"), ("word", "sub")]
    assert all(halves.count(h) == 25 for h in set(halves)) and len(set(halves)) == 4
    assert (sym.name, word.name, mix.name) == ("chain3-add-sub", "chain3-add-sub-word", "chain3-add-sub-sym-word")


def test_other_train_for_a_notation_adds_train_problems_written_the_other_way():
    kwargs = dict(num_train=400, num_validation=100, num_eval=100)
    sym, mostly = ChainTask(**kwargs), ChainTask(other_train=20, **kwargs)
    extra = mostly.train_problems()[400:]
    assert mostly.train_problems()[:400] == sym.train_problems() and len(extra) == 20
    assert all(notation_of(p) == "word" for p in extra)
    # The same arithmetic as the first train problems: nothing from validation or test.
    assert [p.solution for p in extra] == [p.solution for p in sym.train_problems()[:20]]
    assert mostly.validation_problems() == sym.validation_problems() and mostly.name == "chain3-add-sub+20"
    word = ChainTask(notations=("word",), other_train=20, **kwargs)
    assert {notation_of(p) for p in word.train_problems()[400:]} == {"sym"}
    chosen = load_task({"kind": "chain", "notations": ["word"], "other_train": 20, **kwargs})
    assert chosen.train_problems() == word.train_problems()


@pytest.mark.parametrize("bad", [(), ("words",), ("sym", "sym"), "sym", None])
def test_notations_refuses_bad_values_naming_them(bad):
    with pytest.raises(ValueError, match="notations"):
        ChainTask(notations=bad)
    with pytest.raises(ValueError, match="notations"):
        load_task({"kind": "chain", "notations": bad if bad is not None else 3})


def test_half_of_names_the_half_a_mix_is_split_into():
    kwargs = dict(num_train=40, num_validation=8, num_eval=8)
    notations, operations = ChainTask(notations=("sym", "word"), **kwargs), ChainTask(**kwargs)
    assert [notations.half_of(p) for p in notations.eval_problems()[:4]] == ["sym", "sym", "word", "word"]
    assert [operations.half_of(p) for p in operations.eval_problems()[:2]] == ["add", "sub"]
    assert ChainTask(operations=("add",), **kwargs).half_of(make_problem("add", (1, 2, 3))) is None
