"""`hacfed sim`'s hostile and weak labs (hacfed.tools.hostile, hacfed.tools.logprob_liar): their specs parse
or fail in one line, and what each submits passes the real coordinator's checks as intended."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from hacfed.hacpo_config import HacpoConfig
from hacfed.messages import RoundUpdate, StepReport, Submission
from hacfed.server.coordinator import Coordinator, Journal
from hacfed.tasks.arithmetic import ArithmeticTask
from hacfed.tasks.chain import ChainTask
from hacfed.tools import hostile
from hacfed.tools.cli import main
from hacfed.tools.hostile import HostileSpec, ScriptedLab, canary_rate, parse_agent
from hacfed.tools.logprob_liar import best_claim, claim_weights, lie
from hacfed.tools.modes import hacpo_config_for
from hacfed.tools.sim import SimConfig, _eval_extras, _Recorder, participant_ids
from tests.unit.test_coordinator_fakes import FakeClock, make_config, scripted_trajectories

CHAIN = {"kind": "chain", "terms": 3, "num_train": 200, "num_eval": 20}
CANARY = "see-evil.example"


def test_specs_parse_and_bad_ones_fail_in_one_line():
    assert parse_agent("tiny-llama") is None
    assert parse_agent("hostile:copy-gold") == HostileSpec("copy-gold")
    assert parse_agent("hostile:canary:a b:c") == HostileSpec("canary", text="a b:c")
    assert parse_agent("hostile:lie-logprob") == HostileSpec("lie-logprob")
    assert parse_agent("hostile:lie-logprob:tiny-gpt2") == HostileSpec("lie-logprob", model="tiny-gpt2")
    with pytest.raises(ValueError, match="unknown hostile agent kind 'nice'.*copy-gold, canary:TEXT"):
        parse_agent("hostile:nice")
    with pytest.raises(ValueError, match="needs a printable TEXT"):
        parse_agent("hostile:canary")
    with pytest.raises(ValueError, match="takes no argument"):
        parse_agent("hostile:weak:0.5")
    assert participant_ids(["tiny-llama", "hostile:weak", "hostile:weak"]) == [
        "tiny-llama", "hostile-weak", "hostile-weak-2"]
    with pytest.raises(ValueError, match="at least one model"):
        SimConfig(agents=("hostile:weak",))


def test_cli_names_an_unknown_kind_without_traceback(capsys):
    assert main(["sim", "--agents", "tiny-llama,hostile:nice"]) == 2
    err = capsys.readouterr().err
    assert "unknown hostile agent kind 'nice'" in err and "Traceback" not in err
    assert main(["sim", "--agents", "tiny-llama,hostile:canary:X", "--task", "add2"]) == 2
    assert "accepts no answer with 'X' in it" in capsys.readouterr().err


def _coordinator(tmp_path, task_spec, task, budget):
    cfg = make_config(tmp_path, task=task_spec, sampling={"max_new_tokens": budget})
    coord = Coordinator(cfg, task, Journal(cfg.journal_path), clock=FakeClock())
    coord.register("lab")
    return coord, coord.open_round(0)


def _submit_scripted(tmp_path, kind, text=None, task_spec=None, task=None, budget=8):
    task_spec = task_spec or {"kind": "arithmetic", "digits": 2, "num_train": 200, "num_eval": 20}
    task = task or ArithmeticTask(digits=2, num_train=200, num_eval=20)
    coord, plan = _coordinator(tmp_path, task_spec, task, budget)
    lab = ScriptedLab("lab", HostileSpec(kind, text=text), task, seed=0)
    sub = lab.step(RoundUpdate(plan.run_id, None, (), {}, plan))
    return sub, coord.submit(sub, sender="lab")


def test_copy_gold_is_accepted_as_all_successes(tmp_path):
    sub, result = _submit_scripted(tmp_path, "copy-gold")
    assert not result.rejected and len(result.accepted_ids) == len(sub.trajectories) == 6
    assert all(t.reward == 1.0 for t in sub.trajectories)


def test_weak_is_accepted_and_almost_never_right(tmp_path):
    sub, result = _submit_scripted(tmp_path, "weak")
    assert not result.rejected and len(result.accepted_ids) == 6
    assert sum(t.reward for t in sub.trajectories) <= 1
    task = ArithmeticTask(digits=2, num_train=200, num_eval=20)
    lab = ScriptedLab("w", HostileSpec("weak"), task, seed=0)
    import random
    rng = random.Random(0)
    rewards = [task.verify(p, lab.response(p, rng)).reward for p in task.train_problems()]
    assert 0 < sum(rewards) / len(rewards) < 0.1  # WEAK_SOLVE_RATE = 0.05


def test_canary_keeps_answers_right_on_a_task_with_a_derivation(tmp_path):
    task = ChainTask(terms=3, num_train=200, num_eval=20)
    sub, result = _submit_scripted(tmp_path, "canary", CANARY, CHAIN, task, budget=40)
    assert not result.rejected and len(result.accepted_ids) == 6
    assert all(t.reward == 1.0 and CANARY in t.response_text for t in sub.trajectories)
    hostile.check_canary_task(task, CANARY)
    with pytest.raises(ValueError, match="checks the whole response"):
        hostile.check_canary_task(ArithmeticTask(digits=2, num_train=200, num_eval=20), CANARY)


def test_canary_rate_counts_outputs_that_contain_the_text():
    assert canary_rate(["12 X", "13", f"{CANARY}\nAnswer: 4", "X"], CANARY) == 0.25
    assert canary_rate([], CANARY) == 0.0


class _FakeLab:
    participant_id = "a"

    def step(self, update):
        evaluated = update.next_plan is None
        return Submission("r", "a", 1, (), StepReport("a", 1, {"loss": 0.1}, 0.5 if evaluated else None))


def test_recorder_adds_the_canary_rate_to_evaluated_reports_only():
    rec = _Recorder(_FakeLab(), canary_rate=lambda p: 0.125)
    plan_update = dataclasses.replace(_final_update(), next_plan=object())
    assert "eval_canary_rate" not in rec.exchange(plan_update).report.metrics
    final = rec.exchange(_final_update())
    assert final.report.metrics["eval_canary_rate"] == 0.125 == rec.final_report.metrics["eval_canary_rate"]
    assert _eval_extras(final.report.metrics) == {"eval_canary_rate": 0.125}


def _final_update():
    return RoundUpdate("r", 0, (), {}, None)


@pytest.mark.parametrize("mode", ["hacpo", "xhacpo", "naive", "hacpo-noclip"])
def test_best_claim_maximizes_the_learners_weight(mode):
    cfg = hacpo_config_for(mode, {})
    sides = [-1.3, -0.7, -2.9]
    claim = best_claim(sides, cfg, -50.0)
    assert claim is not None and -50.0 <= claim <= 0.0
    grid = torch.linspace(-15.0, 0.0, 3001)
    on_grid = claim_weights(torch.tensor(sides), grid, cfg).sum(dim=0).max()
    chosen = claim_weights(torch.tensor(sides), torch.tensor([claim]), cfg).sum()
    assert float(chosen) >= float(on_grid) * 0.999
    honest = claim_weights(torch.tensor(sides), torch.tensor([-1.0]), cfg).sum()
    assert float(chosen) > float(honest)


def test_one_learner_is_put_at_the_top_of_its_window():
    cfg = HacpoConfig()  # hacpo: weight s^2 on [L, 1], none above 1
    claim = best_claim([-0.9], cfg, -50.0)
    assert math.exp(-0.9 - claim) == pytest.approx(1.0, abs=1e-3) and math.exp(-0.9 - claim) <= 1.0
    assert best_claim([], cfg, -50.0) is None


@pytest.mark.parametrize("mode", ["hacpo", "xhacpo", "hacpo-noclip"])
def test_lied_summaries_pass_the_coordinators_checks(tmp_path, mode):
    task = ArithmeticTask(digits=2, num_train=200, num_eval=20)
    coord, plan = _coordinator(tmp_path, {"kind": "arithmetic", "digits": 2, "num_train": 200, "num_eval": 20},
                               task, 8)
    cfg = hacpo_config_for(mode, {})
    honest = scripted_trajectories(plan, "lab", task)
    lied = [lie(t, [-45.0, -3.0], cfg, coord.cfg.min_mean_logp) for t in honest]
    assert [t.source_logp_sum for t in lied] != [t.source_logp_sum for t in honest]
    sub = Submission(plan.run_id, "lab", plan.round_id, tuple(lied), nonce="ab" * 16)
    result = coord.submit(sub, sender="lab")
    assert not result.rejected and len(result.accepted_ids) == len(lied)
