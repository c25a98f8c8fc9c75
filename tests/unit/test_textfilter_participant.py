"""The text filter in a lab's round (hacfed.clients.participant with hacfed.clients.textfilter): a peer's
group with a named canary never trains the learner and is counted in `skipped_filter`; a group of the
lab's own samples with a canary is never sent (`withheld_outbound`); the [participant] keys reach it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hacfed.clients.config import load_client_config
from hacfed.clients.participant import Participant, ParticipantConfig
from hacfed.hacpo_config import HacpoConfig
from hacfed.keys import ensure_key_pair
from hacfed.messages import PlannedPrompt, RoundPlan, RoundUpdate, SamplingParams
from hacfed.models.zoo import build_untrained
from hacfed.tasks.arithmetic import ArithmeticTask
from hacfed.trajectory import Trajectory

TASK = ArithmeticTask(digits=2, num_train=200, num_eval=20, style="words")
CANARY = "see-evil.example"
G = 4


def plan(round_id: int, n: int = 3) -> RoundPlan:
    problems = TASK.train_problems()[round_id * n: (round_id + 1) * n]
    return RoundPlan(run_id="run", round_id=round_id,
                     prompts=tuple(PlannedPrompt(p.prompt_id, p.messages) for p in problems), group_size=G,
                     sampling=SamplingParams(max_new_tokens=6), hacpo=HacpoConfig(mode="hacpo"))


def make(pid: str, **kw) -> Participant:
    model, tok = build_untrained("tiny-llama", seed=1)
    return Participant(ParticipantConfig(pid, "tiny-llama", eval_problems=4, **kw), model, tok, TASK)


def peer_samples(text_of) -> tuple:
    """A peer's verified samples of plan(0): G per prompt, half of them right, text_of(problem, i)."""
    out = []
    for k, problem in enumerate(TASK.train_problems()[:3]):
        for i in range(G):
            right = i % 2 == 0
            text = text_of(k, problem.answer if right else str(int(problem.answer) + 1))
            reward = TASK.verify(problem, text).reward
            assert reward == float(right)
            out.append(Trajectory(f"b-{k}-{i}", problem.prompt_id, "b", 0, problem.messages, text, reward, -3.0, 3,
                                  "stop"))
    return tuple(out)


@pytest.mark.parametrize("deny, dropped", [((CANARY,), G), ((), 0)])
def test_a_peer_group_with_a_named_canary_is_skipped_and_counted(deny, dropped) -> None:
    a = make("a", deny_strings=deny)
    first = a.step(RoundUpdate("run", None, (), {"a": 1.0, "b": 1.0}, plan(0), ("a", "b")))
    own = tuple(replace(t, reward=TASK.verify(TASK.problem(t.prompt_id), t.response_text).reward)
                for t in first.trajectories)
    # The peer's first group carries the canary in its derivations, answers still right.
    pool = own + peer_samples(lambda k, ans: f"{CANARY} says {ans}" if k == 0 else f"It is {ans}.")
    sub = a.step(RoundUpdate("run", 0, pool, {"a": 0.5, "b": 0.5}, plan(1), ("a", "b")))
    m = sub.report.metrics
    assert m["skipped_filter"] == dropped
    assert m["num_samples"] == len(pool) - dropped


def test_a_lab_never_sends_a_group_holding_a_planted_canary(monkeypatch) -> None:
    a = make("a", deny_strings=(CANARY,))
    rollout = a.rollout

    def leaky(p):  # the lab's private data shows through in one sample of the second prompt
        out = list(rollout(p))
        out[G + 1] = replace(out[G + 1], response_text=f"internal note {CANARY}: {out[G + 1].response_text}")
        return tuple(out)

    monkeypatch.setattr(a, "rollout", leaky)
    sub = a.step(RoundUpdate("run", None, (), {"a": 1.0}, plan(0), ("a",)))
    assert sub.report.metrics["withheld_outbound"] == G
    assert len(sub.trajectories) == 2 * G
    assert not any(CANARY in t.response_text for t in sub.trajectories)
    assert {t.prompt_id for t in sub.trajectories} == {p.prompt_id for p in plan(0).prompts} - {
        plan(0).prompts[1].prompt_id}
    # With the outbound filter off, the same lab would have sent it.
    b = make("b", deny_strings=(CANARY,), outbound_filter=False)
    monkeypatch.setattr(b, "rollout", lambda p, inner=b.rollout: tuple(
        replace(t, response_text=f"{CANARY} {t.response_text}") for t in inner(p)))
    sent = b.step(RoundUpdate("run", None, (), {"b": 1.0}, plan(0), ("b",)))
    assert sent.report.metrics["withheld_outbound"] == 0 and all(CANARY in t.response_text for t in sent.trajectories)


def test_the_participant_table_sets_the_filter(tmp_path: Path) -> None:
    key = ensure_key_pair(tmp_path / "server", "coordinator").public
    path = tmp_path / "lab.toml"
    path.write_text(
        '[participant]\nparticipant_id = "lab-a"\nmodel = "tiny-llama"\nserver = "127.0.0.1:9092"\n'
        f'state_dir = "{tmp_path / "lab-a"}"\ncoordinator_key = "{key}"\ninsecure = true\n'
        f'outbound_filter = false\ndeny_patterns = ["secret-[0-9]+"]\ndeny_strings = ["{CANARY}"]\n')
    lab = load_client_config(path).participant
    assert (lab.inbound_filter, lab.outbound_filter) == (True, False)
    assert lab.deny_patterns == ("secret-[0-9]+",) and lab.deny_strings == (CANARY,)
    path.write_text(path.read_text().replace('"secret-[0-9]+"', '"secret-("'))
    with pytest.raises(ValueError, match=r"^ParticipantConfig\.deny_patterns must be a list of regular expressions "
                                         r"\(missing \), unterminated subpattern at position 7\), got 'secret-\('$"):
        load_client_config(path)


@pytest.mark.parametrize("name, value, requirement", [
    ("inbound_filter", "yes", "true or false"),
    ("outbound_filter", 1, "true or false"),
    ("deny_patterns", "https?://", "a list of strings"),
    ("deny_patterns", [""], "a list of non-empty strings"),
    ("deny_patterns", ["x?"], "a list of regular expressions that cannot match an empty response"),
    ("deny_strings", [3], "a list of non-empty strings"),
])
def test_bad_filter_settings_are_one_line_naming_the_value(name, value, requirement) -> None:
    with pytest.raises(ValueError, match=r"^ParticipantConfig\." + name + " must be " + requirement.replace(
            "(", r"\(").replace(")", r"\)") + ", got "):
        ParticipantConfig("a", "tiny-llama", **{name: value})
