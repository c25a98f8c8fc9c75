"""Token-budget microbatches: order kept, budget kept, weights that make accumulation exact."""

from __future__ import annotations

import pytest
import torch

from hacfed.clients.microbatch import accumulation_weights, padded_tokens, split_by_tokens, split_rows


def test_groups_keep_order_and_the_budget():
    lengths = [120, 340, 90, 400, 30, 30, 30]
    groups = split_by_tokens(lengths, token_budget=800)
    assert groups == [[0, 1], [2, 3], [4, 5, 6]]
    assert [i for g in groups for i in g] == list(range(len(lengths)))
    assert all(len(g) * max(lengths[i] for i in g) <= 800 for g in groups)
    assert padded_tokens(groups, lengths) == 2 * 340 + 2 * 400 + 3 * 30


def test_a_row_longer_than_the_budget_is_alone_and_never_dropped():
    assert split_by_tokens([50, 900, 50], token_budget=100) == [[0], [1], [2]]
    assert split_by_tokens([10] * 5, token_budget=10_000) == [[0, 1, 2, 3, 4]]


@pytest.mark.parametrize("budget, lengths, match", [
    (0, [1], "token_budget"), (True, [1], "token_budget"), (10, [3, 0], "row 1"), (10, [2.5], "row 0"),
])
def test_bad_input_is_named(budget, lengths, match):
    with pytest.raises(ValueError, match=match):
        split_by_tokens(lengths, budget)


@pytest.mark.parametrize("per", ["sequence", "token"])
def test_weighted_microbatch_gradients_equal_the_whole_minibatch_gradient(per):
    torch.manual_seed(0)
    lengths = [7, 3, 9, 2, 5]
    w = torch.randn(4, requires_grad=True)
    rows = [torch.randn(n, 4) for n in lengths]

    def loss(indices):
        per_token = [rows[i] @ w for i in indices]
        if per == "sequence":
            return torch.stack([t.mean() for t in per_token]).mean()
        return torch.cat(per_token).mean()

    (whole,) = torch.autograd.grad(loss(range(len(lengths))), w)
    groups = split_by_tokens(lengths, token_budget=12)
    assert len(groups) > 1
    total = sum(weight * loss(g) for g, weight in zip(groups, accumulation_weights(groups, lengths, per)))
    (accumulated,) = torch.autograd.grad(total, w)
    assert torch.allclose(whole, accumulated, atol=1e-6)


def test_split_rows_bounds_the_packed_width():
    # the update left-pads prompts and right-pads responses: a group is rows x (longest prompt + longest response)
    prompts, responses = [10, 2, 2, 10], [2, 10, 10, 2]
    assert split_rows(prompts, responses, token_budget=36) == [[0], [1, 2], [3]]  # [0, 1] would pack 2 x 20
    assert split_by_tokens([12, 12, 12, 12], token_budget=36) == [[0, 1, 2], [3]]  # no prompt/response split
    with pytest.raises(ValueError, match="row 1"):
        split_rows([1, 0], [1, 0], 10)
    with pytest.raises(ValueError, match="2 prompt lengths for 1 responses"):
        split_rows([1, 1], [1], 10)
