"""Duplicate successes count once (`dedup_successes`, docs/security.md "Duplicate successes count
once"): the pure rule (`hacfed.capability.credit_successes`), its bounded memory, the setting's
refusals, P̂ exactly today's with it off, and the coordinator's credits surviving a restart."""

from __future__ import annotations

import pytest

from hacfed.capability import DEDUP_MIN_CHARS, SuccessMemory, credit_successes, normalise_response, response_key
from hacfed.messages import Submission
from hacfed.server.coordinator import Coordinator, Journal
from hacfed.server.coordinator.pool_share import PoolShares
from hacfed.tasks.chain import ChainTask
from hacfed.trajectory import ChatMessage, Trajectory
from tests.unit.test_coordinator_fakes import FakeClock, make_config

LONG = "Step one: add the first two numbers. Step two: add the third number to it. The answer is 42."
OTHER = "First I add the last two numbers, then I add the first one to their sum, which gives 42 in all."


def test_normalisation_ignores_case_width_and_whitespace():
    assert normalise_response("  The\tANSWER\n\n is  42 ") == "the answer is 42"
    assert normalise_response("ＡＢＣ 42") == normalise_response("abc 42")  # NFKC: full-width letters
    assert response_key("p", LONG) == response_key("p", "  " + LONG.upper().replace(" ", "\n"))
    assert response_key("p", LONG) != response_key("q", LONG)  # a key is per prompt
    assert response_key("p", "Answer: 42") is None  # short: what every solver writes, no evidence
    assert len(normalise_response(LONG)) >= DEDUP_MIN_CHARS


def test_a_canonical_worked_solution_is_never_evidence_but_a_derivation_is():
    for terms in (3, 6):  # chain's longest worked solutions: what every lab that learnt the task writes
        assert all(response_key(p.prompt_id, p.solution) is None for p in ChainTask(terms=terms).train_problems())
    gold = "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April and May.\n#### 72"
    credits, _ = credit_successes([("copy-gold", "gsm8k-0", gold, 1.0)] * 8, SuccessMemory())
    assert credits == [1.0] + [0.0] * 7  # a copy-gold group of G = 8 counts as one success


def test_a_group_of_identical_successes_counts_once():
    memory = SuccessMemory()
    samples = [("a", "p", LONG, 1.0)] * 4
    credits, added = credit_successes(samples, memory)
    assert credits == [1.0, 0.0, 0.0, 0.0]
    assert [lab for _, lab in added] == ["a"] * 4  # all remembered once committed
    spaced = [("a", "p", LONG, 1.0), ("a", "p", "  " + LONG.lower(), 1.0), ("a", "p", OTHER, 1.0)]
    assert credit_successes(spaced, memory)[0] == [1.0, 0.0, 1.0]  # normalised alike: one text


def test_short_successes_and_failures_are_credited_as_they_are():
    samples = [("a", "p", "42", 1.0)] * 3 + [("a", "p", LONG, 0.0), ("a", "p", LONG, 0.5)]
    credits, added = credit_successes(samples, SuccessMemory())
    assert credits == [1.0, 1.0, 1.0, 0.0, 0.5]
    assert len(added) == 1  # only the keyed success is remembered


def test_a_text_first_accepted_from_another_lab_counts_zero_for_the_copier_only():
    memory = SuccessMemory()
    credits, added = credit_successes([("a", "p", LONG, 1.0)], memory)
    for key, lab in added:
        memory.add(key, lab)
    assert credit_successes([("b", "p", LONG, 1.0)], memory)[0] == [0.0]  # b replays a's text
    assert credit_successes([("a", "p", LONG, 1.0)], memory)[0] == [1.0]  # a writes its own again
    assert credit_successes([("b", "q", LONG, 1.0)], memory)[0] == [1.0]  # another prompt: another key
    assert credit_successes([("b", "p", OTHER, 1.0)], memory)[0] == [1.0]  # its own text


def test_the_memory_is_bounded_and_forgets_the_oldest_first():
    memory = SuccessMemory(size=3)
    k1, k2 = response_key("p", LONG), response_key("p", OTHER)
    memory.add(k1, "a")
    memory.add(k1, "b")
    memory.add(k2, "c")
    assert len(memory) == 3 and memory.owner(k1) == "a"
    memory.add(k2, "d")  # a's acceptance of k1 is forgotten: b's is now the earliest remembered
    assert len(memory) == 3 and memory.owner(k1) == "b" and memory.owner(k2) == "c"
    memory.add(k2, "e")
    memory.add(k2, "f")
    assert len(memory) == 3 and memory.owner(k1) is None and memory.owner(k2) == "d"
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ValueError, match=f"success memory size must be an integer >= 1, got {bad!r}"):
            SuccessMemory(bad)


def test_bad_values_of_the_setting_are_refused_naming_the_value(tmp_path):
    for bad in ("yes", 1, 0, None, "true"):
        with pytest.raises(ValueError, match=rf"CoordinatorConfig.dedup_successes must be true or false, got {bad!r}"):
            make_config(tmp_path, dedup_successes=bad)
    off, on = make_config(tmp_path), make_config(tmp_path, dedup_successes=True)
    assert off.dedup_successes is False  # the built-in default: P̂ as docs/hacpo.md defines it
    assert "dedup_successes" not in off.plan_fingerprint()  # a journal of before the setting resumes
    assert on.plan_fingerprint()["dedup_successes"] is True  # and cannot be switched mid-run


def test_the_successes_choice_ranks_by_the_credit_when_given():
    prompt = (ChatMessage("user", "1+1="),)
    pool = [Trajectory(f"{s}/{k}", "p", s, 0, prompt, "x", reward, -1.0, 1, "stop")
            for s, reward in (("a", 1.0), ("b", 1.0), ("c", 0.0), ("d", 0.0)) for k in range(2)]
    plain = PoolShares(pool, 1, "salt", "successes")
    credited = PoolShares(pool, 1, "salt", "successes", credit={("p", "a"): 0.0, ("p", "b"): 0.0, ("p", "c"): 2.0})
    assert {s for _, s in plain.groups_for("d")} <= {"a", "b", "d"}
    assert {s for _, s in credited.groups_for("d")} == {"c", "d"}


# -- through the real coordinator ----------------------------------------------------------------------

TASK = ChainTask()
RECURRING = ChainTask(num_train=3, num_validation=1, num_eval=1)  # 3 prompts, 2 a round: they recur


def _text(lab: str, problem) -> str:
    return f"{lab} works it out one step at a time, then checks every sum twice.\n{problem.solution}"


def _run(tmp_path, dedup: bool, restart_after: int | None = None, rounds: int = 3, replay: bool = False):
    """Labs a and b each solve every prompt in their own words (G = 2, both samples the same text); c
    submits a's text of every prompt after a (a replays nothing of its own). With `replay`, prompts
    recur and c submits first from round 1 on: a's text of a prompt a answered in an earlier round,
    its own text of a new one. With `restart_after`, the coordinator is rebuilt from its journal after
    that round's submissions."""
    task, table = (RECURRING, {"kind": "chain", "num_train": 3, "num_validation": 1, "num_eval": 1}) if replay \
        else (TASK, {"kind": "chain"})
    cfg = make_config(tmp_path, rounds=rounds, prompts_per_round=2, group_size=2, expected_participants=3,
                      min_participants=3, dedup_successes=dedup, task=table, sampling={"max_new_tokens": 64})
    clock = FakeClock()
    coord = Coordinator(cfg, task, Journal(cfg.journal_path), clock=clock)
    for pid in "abc":
        coord.register(pid)
    history, answered = [], set()
    for r in range(rounds):
        plan = coord.open_round(r)
        for lab in ("cab" if replay and r > 0 else "abc"):
            trajectories = []
            for planned in plan.prompts:
                problem = task.problem(planned.prompt_id)
                author = lab if lab != "c" else ("a" if not replay or planned.prompt_id in answered else "c")
                text = _text(author, problem)
                for k in range(plan.group_size):
                    trajectories.append(Trajectory(f"{lab}/{r}/{planned.prompt_id}/{k}", planned.prompt_id, lab, 0,
                                                   planned.messages, text, 1.0, -20.0, 40, "stop"))
            result = coord.submit(Submission(cfg.run_id, lab, r, tuple(trajectories), nonce=f"{lab}{r}".ljust(32, "0")))
            assert not result.rejected
        answered.update(p.prompt_id for p in plan.prompts)
        if restart_after == r:
            coord.journal.close()
            coord = Coordinator(cfg, task, Journal(cfg.journal_path), clock=clock)
            coord.resume()
        closed = coord.close_round("quorum")
        history.append((closed.capabilities, coord.intake.group_credit(r)))
    coord.journal.close()
    return history


def test_with_the_setting_off_capability_is_exactly_todays(tmp_path):
    history = _run(tmp_path, dedup=False)
    for capabilities, credit in history:
        assert capabilities == {"a": 1.0, "b": 1.0, "c": 1.0}  # every sample a verified success
        assert credit is None  # the successes choice ranks by the verified rewards in the pool


def test_with_the_setting_on_copies_count_once_and_the_copier_nothing(tmp_path):
    history = _run(tmp_path, dedup=True)
    for capabilities, credit in history:
        assert capabilities["a"] == pytest.approx(0.5) and capabilities["b"] == pytest.approx(0.5)  # 1 of G = 2
        assert capabilities["c"] < 1e-6  # a's text, accepted from a first: floored
        assert set(credit.values()) == {1.0, 0.0} and all(v == 0.0 for (_, lab), v in credit.items() if lab == "c")


def test_the_credits_survive_a_coordinator_restart(tmp_path):
    straight = _run(tmp_path / "straight", dedup=True)
    for after in (0, 1):
        assert _run(tmp_path / f"restart{after}", dedup=True, restart_after=after) == straight
    # c replays a's texts of earlier rounds before a answers again: only the memory of those rounds,
    # which a restart rebuilds from the journal, credits them 0
    straight = _run(tmp_path / "replay", dedup=True, rounds=6, replay=True)
    late = [v for _, credit in straight[2:] for (_, lab), v in credit.items() if lab == "c"]
    assert 0.0 in late and 1.0 in late  # copies of earlier rounds' texts, and c's own new ones
    for after in (1, 2, 3, 4):
        assert _run(tmp_path / f"replay{after}", dedup=True, rounds=6, replay=True, restart_after=after) == straight


def test_hacfed_sim_hands_dedup_successes_to_its_coordinator(tmp_path) -> None:
    import argparse

    from hacfed.tasks.registry import load_task
    from hacfed.tools import sim_cli
    from hacfed.tools.sim import SimConfig, _coordinator_config

    parser = argparse.ArgumentParser()
    sim_cli.add_parser(parser.add_subparsers())
    assert parser.parse_args(["sim", "--dedup-successes"]).dedup_successes
    assert not parser.parse_args(["sim"]).dedup_successes
    cfg = SimConfig(agents=("tiny-llama", "tiny-gpt2"), dedup_successes=True, state_dir=str(tmp_path))
    assert _coordinator_config(cfg, load_task(cfg.task), ["tiny-llama", "tiny-gpt2"]).dedup_successes
    assert not SimConfig().dedup_successes  # off by default: P̂ is the paper's
