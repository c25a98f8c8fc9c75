"""Guided rollouts (docs/partner_rules.md, `hacfed.clients.guided`), worked by hand: the trigger, the
hint's text, the score by agreement with a partner's verified answer, the view the update trains
(plain or hinted prompt), and the advantages of a rescued group.

The update runs on the hand-worked harness of test_update_example (a context-free learner with
uniform logits, SGD at lr 0, the gradient of the loss with respect to each row's mean read back).
"""

from __future__ import annotations

import math

import pytest
import torch

from hacfed.clients.guided import (
    HINT_ANSWER,
    HINT_RESPONSE,
    Rescue,
    check_task,
    find_rescues,
    guided_reward,
    guided_rollouts,
    hinted_prompt,
    training_pool,
)
from hacfed.clients.update import hacpo_update
from hacfed.hacpo_config import HacpoConfig
from hacfed.rollout.hf import Completion
from hacfed.tasks.arithmetic import ArithmeticTask
from hacfed.tasks.chain import ChainTask
from hacfed.tools.modes import hacpo_config_for
from hacfed.trajectory import ChatMessage, Trajectory, build_training_view, render_prompt_ids
from tests.unit.test_update_example import TOK, UniformLM, row_grads

GUIDED = HacpoConfig(mode="xhacpo", guide_samples=2, partner_use="context")
WORDS = ArithmeticTask(style="words", num_train=50, num_eval=10)
QUESTION = "What is 37 + 58? Reply with only the number."


def traj(name: str, prompt_id: str, source: str, text: str, reward: float, question: str = QUESTION) -> Trajectory:
    return Trajectory(name, prompt_id, source, 0, (ChatMessage("user", question),), text, reward, -1.0, 2, "stop")


# ---- trigger ------------------------------------------------------------------------------------

# P: own [0, 0], zed right ("95") and wrong -> rescued by "95"
# Q: own [1, 0] (mean .5) and zed right -> rescued only when guide_max_own_reward >= .5
# R: own [0, 0], zed only wrong -> short, not rescued;   S: no own sample, zed right -> not short
# T: own [0], zed right twice: the shorter text guides ("140", not "The sum is 140.")
POOL = [
    traj("me-P-0", "P", "me", "9", 0.0), traj("me-P-1", "P", "me", "nine", 0.0),
    traj("zed-P-0", "P", "zed", "95", 1.0), traj("zed-P-1", "P", "zed", "96", 0.0),
    traj("me-Q-0", "Q", "me", "95", 1.0), traj("me-Q-1", "Q", "me", "9", 0.0), traj("zed-Q-0", "Q", "zed", "95", 1.0),
    traj("me-R-0", "R", "me", "1", 0.0), traj("me-R-1", "R", "me", "2", 0.0), traj("zed-R-0", "R", "zed", "3", 0.0),
    traj("zed-S-0", "S", "zed", "95", 1.0),
    traj("me-T-0", "T", "me", "1", 0.0), traj("zed-T-0", "T", "zed", "The sum is 140.", 1.0),
    traj("zed-T-1", "T", "zed", "140", 1.0),
]


def test_trigger_rescues_the_prompts_every_own_sample_failed_with_a_partner_success():
    rescues, short = find_rescues(POOL, "me", GUIDED, WORDS)
    assert short == 3  # P, R, T
    assert [(r.prompt_id, r.hint.trajectory_id, r.answer) for r in rescues] == [("P", "zed-P-0", "95"),
                                                                                ("T", "zed-T-1", "140")]
    # "own mean at most x": at .5, Q's own [1, 0] falls short too
    rescues, short = find_rescues(POOL, "me", HacpoConfig(**{**GUIDED.to_dict(), "guide_max_own_reward": 0.5}), WORDS)
    assert short == 4 and [r.prompt_id for r in rescues] == ["P", "Q", "T"]


def test_a_success_whose_answer_the_task_cannot_read_guides_nothing():
    pool = [traj("me-P-0", "P", "me", "9", 0.0), traj("zed-P-0", "P", "zed", "no number", 1.0)]
    assert find_rescues(pool, "me", GUIDED, WORDS) == ([], 1)


# ---- hint ---------------------------------------------------------------------------------------

def test_the_hint_goes_into_the_last_user_turn():
    rescue = Rescue("P", (ChatMessage("system", "Be brief."), ChatMessage("user", QUESTION)),
                    traj("zed-P-0", "P", "zed", " 37 + 58 = 95\n", 1.0), "95")
    assert HINT_RESPONSE == "\n\nA correct answer from another solver:\n{text}\n\nSolve it yourself."
    assert HINT_ANSWER == "\n\nThe correct answer is {answer}. Solve it yourself."
    assert hinted_prompt(rescue, "response") == (
        ChatMessage("system", "Be brief."),
        ChatMessage("user", QUESTION + "\n\nA correct answer from another solver:\n37 + 58 = 95\n\nSolve it yourself."),
    )
    assert hinted_prompt(rescue, "answer")[-1] == ChatMessage(
        "user", QUESTION + "\n\nThe correct answer is 95. Solve it yourself.")
    # a prompt that does not end with a user turn gets the hint as one
    ends_with_assistant = Rescue("P", (ChatMessage("user", "q"), ChatMessage("assistant", "a")), rescue.hint, "95")
    assert hinted_prompt(ends_with_assistant, "answer")[-1] == ChatMessage(
        "user", "The correct answer is 95. Solve it yourself.")


# ---- score ----------------------------------------------------------------------------------------

def test_a_continuation_is_scored_by_the_tasks_verifier_against_the_partners_answer():
    rescue = Rescue("P", (ChatMessage("user", QUESTION),), traj("zed-P-0", "P", "zed", "The answer is 95.", 1.0),
                    WORDS.answer_of("The answer is 95."))
    assert rescue.answer == "95"
    assert guided_reward(WORDS, rescue, "37 + 58 = 95") == 1.0  # the last integer agrees
    assert guided_reward(WORDS, rescue, "95, no: 96") == 0.0
    assert WORDS.answer_of("it is 1,080 in all") == "1080" and WORDS.answer_of("none") is None
    symbols = ArithmeticTask(num_train=50, num_eval=10)
    assert symbols.answer_of(" 95 ") == "95" and symbols.answer_of("95 apples") is None
    # chain: the verifier checks every worked step too, not only the final answer
    chain = ChainTask(num_train=10, num_validation=10, num_eval=10)
    worked = "47+28=75\n75+15=90\nAnswer: 90"
    rescue = Rescue("c", (ChatMessage("user", "47+28+15="),), traj("z", "c", "zed", worked, 1.0),
                    chain.answer_of(worked))
    assert rescue.answer == "90"
    assert guided_reward(chain, rescue, worked) == 1.0
    assert guided_reward(chain, rescue, "47+28=76\n76+14=90\nAnswer: 90") == 0.0  # a false step


def test_a_task_that_cannot_read_an_answer_refuses_guided_rollouts():
    class Opaque:
        name = "opaque"

    with pytest.raises(ValueError, match="task 'opaque' has none"):
        check_task(Opaque())
    check_task(WORDS)


# ---- the continuations and the view the update trains -------------------------------------------

class ByteTokenizer:
    """One id per byte (pad 0, EOS 1); the chat template joins the messages' text and ends with ':'."""

    pad_token_id, eos_token_id = 0, 1

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(m["content"] for m in messages) + ":"

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [2 + b for b in text.encode()]}


class Sampler:
    """Answers every prompt with `texts`, in turn; records what it was asked."""

    def __init__(self, texts):
        self.texts, self.asked = texts, []

    def __call__(self, prompts, n):
        self.asked.append((list(prompts), n))
        ids = (2 + ord("x"),)
        return [[Completion(self.texts[k % len(self.texts)], ids, (-0.5,), "stop") for k in range(n)] for _ in prompts]


def rollouts(cfg: HacpoConfig, sampler: Sampler, context: int = 512):
    return guided_rollouts(POOL, "me", cfg, WORDS, sampler, ByteTokenizer(), context=context, max_prompt_len=context,
                           max_new_tokens=8, policy_version=3, tag="run/r4")


def test_plain_context_trains_the_hinted_continuations_as_samples_of_the_original_prompt():
    sampler = Sampler(["37 + 58 = 95", "94"])
    batch = rollouts(GUIDED, sampler)
    (asked, n), = sampler.asked
    rescues, _ = find_rescues(POOL, "me", GUIDED, WORDS)
    assert n == 2 and asked == [hinted_prompt(r, "response") for r in rescues]  # sampled with the hint
    got = [(t.trajectory_id, t.prompt_id, t.source_id, t.policy_version, t.response_text, t.reward)
           for t in batch.trajectories]
    assert got == [
        ("run/r4/me/guided/P/0", "P", "me", 3, "37 + 58 = 95", 1.0), ("run/r4/me/guided/P/1", "P", "me", 3, "94", 0.0),
        ("run/r4/me/guided/T/0", "T", "me", 3, "37 + 58 = 95", 0.0), ("run/r4/me/guided/T/1", "T", "me", 3, "94", 0.0),
    ]
    original = (ChatMessage("user", QUESTION),)
    assert all(t.prompt == original and t.response_token_ids == (2 + ord("x"),) for t in batch.trajectories)
    # the update's view: the plain prompt's tokens, the hint dropped
    view = build_training_view(batch.trajectories[0], "me", ByteTokenizer(), 512, 64)
    assert list(view.prompt_ids) == render_prompt_ids(ByteTokenizer(), original) and view.is_self
    # hinted: the same continuations, trained with the hint in context
    hinted = rollouts(HacpoConfig(**{**GUIDED.to_dict(), "guide_context": "hinted"}), Sampler(["94"]))
    assert [t.prompt for t in hinted.trajectories] == [hinted_prompt(r, "response") for r in rescues for _ in (0, 1)]
    # 2 rescued of 3 short prompts; 4 samples, 1 right; 2 of zed's 7 samples served as hints, none with gradient
    assert batch.metrics == {"guide/short_prompts": 3.0, "guide/prompts": 2.0, "guide/samples": 4.0,
                             "guide/skipped_context": 0.0, "guide/success_frac": 0.25,
                             "partner/in_context_frac": 2 / 7, "partner/grad_frac": 0.0}


def test_a_hinted_prompt_that_leaves_no_room_for_the_answer_is_skipped():
    # P's hinted prompt renders to 107 tokens (its hint "95"), T's to 108 ("140"): a context of 116
    # leaves room for 8 new tokens + EOS after P's only
    lengths = [len(render_prompt_ids(ByteTokenizer(), hinted_prompt(r, "response")))
               for r in find_rescues(POOL, "me", GUIDED, WORDS)[0]]
    assert lengths == [107, 108]
    sampler = Sampler(["95"])
    batch = rollouts(GUIDED, sampler, context=116)
    assert sampler.asked[0][0] == [hinted_prompt(find_rescues(POOL, "me", GUIDED, WORDS)[0][0], "response")]
    assert batch.metrics["guide/prompts"] == 1.0 and batch.metrics["guide/skipped_context"] == 1.0


def test_partners_used_in_context_leave_the_update():
    assert [t.source_id for t in training_pool(POOL, "me", GUIDED)] == ["me"] * 7
    assert training_pool(POOL, "me", HacpoConfig(mode="xhacpo", guide_samples=2)) == tuple(POOL)


# ---- advantages of a rescued group ----------------------------------------------------------------

def test_a_rescued_group_gets_spread_from_its_guided_samples():
    """Own [0, 0, 0, 0] on p has no spread (A = 0: no signal); with guided [1, 1] the group is
    [0, 0, 0, 0, 1, 1]: μ = 1/3 (own samples only, weight 1), unbiased std sqrt((4/9·... ) = sqrt(4/15):
        Σdev² = 4·(1/3)² + 2·(2/3)² = 4/9 + 8/9 = 4/3, / 5 = 4/15 -> .516398
        A(0) = −(1/3) / .516399 = −.645497, A(1) = (2/3) / .516399 = 1.290994
    One minibatch of the pool's size 4 (the guided rows take a second), d loss / d mean_i = −A_i / rows."""
    def t(name, source, text, reward):
        return Trajectory(name, "p", source, 0, (ChatMessage("user", "p"),), text, reward, -3.0, 1, "stop")

    own = [t(f"me-{c}", "me", c, 0.0) for c in "abcd"]
    zed = [t("zed-0", "zed", "z", 1.0)]
    guided = [t("g-0", "me", "g", 1.0), t("g-1", "me", "h", 1.0)]

    def grads(pool):
        model = UniformLM()
        out = hacpo_update(model, TOK, torch.optim.SGD(model.parameters(), lr=0.0), None, pool, "me", ("me", "zed"),
                           {"me": 0.5, "zed": 0.5}, GUIDED, minibatch_size=4, max_grad_norm=1e9, max_prompt_len=64,
                           max_response_len=64, skip_no_grad=False)
        rows: dict[str, float] = {}
        for call in model.calls:
            rows.update(row_grads(call))
        return rows, out

    rows, _ = grads([*training_pool([*own, *zed], "me", GUIDED)])
    assert rows == pytest.approx({c: 0.0 for c in "abcd"}, abs=1e-9)  # all failed: no signal
    rows, out = grads([*training_pool([*own, *zed], "me", GUIDED), *guided])
    std = math.sqrt(4 / 15) + 1e-6
    a0, a1 = -(1 / 3) / std, (2 / 3) / std
    assert a0 == pytest.approx(-0.645496, abs=1e-6) and a1 == pytest.approx(1.290992, abs=1e-6)
    assert rows == pytest.approx({**{c: -a0 / 4 for c in "abcd"}, "g": -a1 / 2, "h": -a1 / 2}, abs=1e-6)
    assert out["num_cross"] == 0.0 and "z" not in rows  # zed's success only guided


# ---- settings ------------------------------------------------------------------------------------

def test_guided_settings_are_xhacpo_options_off_by_default():
    assert HacpoConfig().guide_samples == 0 and HacpoConfig(mode="xhacpo").partner_use == "gradient"
    with pytest.raises(ValueError, match=r"\['guide_samples'\] only apply to mode 'xhacpo'"):
        HacpoConfig(mode="hacpo", guide_samples=2)
    with pytest.raises(ValueError, match="only apply with guide_samples > 0"):
        HacpoConfig(mode="xhacpo", guide_context="hinted")
    with pytest.raises(ValueError, match="partner_use 'context' leaves no partner sample"):
        HacpoConfig(mode="xhacpo", guide_samples=2, partner_use="context", rescue_max_own_reward=0.0)
    with pytest.raises(ValueError, match="guide_samples must be an integer in"):
        HacpoConfig(mode="xhacpo", guide_samples=1.5)
    assert hacpo_config_for("xhacpo-guided") == HacpoConfig(
        mode="xhacpo", cross_ratio_unit="byte", cross_clip_style="pessimistic", cross_negatives="skip",
        guide_samples=4, partner_use="context")
    assert hacpo_config_for("xhacpo-guided-hinted").guide_context == "hinted"
