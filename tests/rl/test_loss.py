"""The policy loss against hand-worked values: each term, its sign, its scale and its gradient.

Written so that each plausible slip turns a test red (checked by hand, one change at a time):
the KL's sign flipped or the KL dropped, PPO's min turned into max, the clip range ignored,
the token mean replaced by a sum (or any constant factor on the loss), padding counted.
"""
import math

import pytest
import torch

from evolve.rl.loss import importance_weights, policy_loss, token_logprobs


def loss_of(logp, old, ref, adv, mask=None, **kw):
    logp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    old, adv = torch.tensor(old, dtype=torch.float64), torch.tensor(adv, dtype=torch.float64)
    ref = None if ref is None else torch.tensor(ref, dtype=torch.float64)
    mask = torch.ones_like(logp) if mask is None else torch.tensor(mask, dtype=torch.float64)
    parts = policy_loss(logp, old, ref, adv, mask, **kw)
    parts.loss.backward()
    return parts, logp.grad


def test_unclipped_ratio_gives_minus_advantage_times_ratio_token_mean():
    # two tokens, ratios e^0.1 and e^-0.1 (inside 1 +- 0.2), A = 2: loss = -2 * mean(ratios)
    parts, grad = loss_of([[-1.0, -2.0]], [[-1.1, -1.9]], None, [2.0], clip=0.2, kl_coef=0.0)
    r = [math.exp(0.1), math.exp(-0.1)]
    assert float(parts.loss) == pytest.approx(-2 * (r[0] + r[1]) / 2)
    assert grad[0].tolist() == pytest.approx([-2 * r[0] / 2, -2 * r[1] / 2])  # d/dlogp of -A r / n
    assert int(parts.clipped) == 0


def test_ppo_takes_the_pessimistic_branch_and_stops_its_gradient():
    # A > 0, ratio 1.5 > 1.2: min(1.5 A, 1.2 A) = 1.2 A (max would give 1.5 A), no gradient
    parts, grad = loss_of([[math.log(1.5)]], [[0.0]], None, [1.0], clip=0.2, kl_coef=0.0)
    assert float(parts.loss) == pytest.approx(-1.2)
    assert grad[0, 0] == 0.0 and int(parts.clipped) == 1
    # A < 0, ratio 0.5 < 0.8: min(0.5 A, 0.8 A) = 0.8 A -> loss +0.8 |A|, no gradient
    parts, grad = loss_of([[math.log(0.5)]], [[0.0]], None, [-1.0], clip=0.2, kl_coef=0.0)
    assert float(parts.loss) == pytest.approx(0.8)
    assert grad[0, 0] == 0.0 and int(parts.clipped) == 1
    # A < 0, ratio 1.5: the unclipped 1.5 A is the smaller: it is kept, with its gradient
    parts, grad = loss_of([[math.log(1.5)]], [[0.0]], None, [-1.0], clip=0.2, kl_coef=0.0)
    assert float(parts.loss) == pytest.approx(1.5) and grad[0, 0] == pytest.approx(1.5)


def test_k3_kl_to_the_reference_value_sign_and_gradient():
    # logp = -1 above ref = -2: delta = ref - logp = -1, k3 = e^-1 + 1 - 1 = 0.3679 (flipped: 0.718)
    beta = 0.5
    parts, grad = loss_of([[-1.0]], [[-1.0]], [[-2.0]], [0.0], clip=0.2, kl_coef=beta)
    k3 = math.exp(-1.0)
    assert float(parts.kl) == pytest.approx(k3)
    assert float(parts.loss) == pytest.approx(beta * k3)  # A = 0: the KL is the whole loss
    # d k3 / d logp = 1 - e^(ref - logp) > 0: the penalty pulls logp down towards ref
    assert grad[0, 0] == pytest.approx(beta * (1 - math.exp(-1.0)))
    # below the reference the pull is upwards
    _, grad = loss_of([[-3.0]], [[-3.0]], [[-2.0]], [0.0], clip=0.2, kl_coef=beta)
    assert grad[0, 0] == pytest.approx(beta * (1 - math.exp(1.0))) and grad[0, 0] < 0


def test_kl_adds_to_the_policy_term():
    with_kl, _ = loss_of([[-1.0, -2.0]], [[-1.0, -2.0]], [[-1.5, -1.5]], [1.0], clip=0.2, kl_coef=0.1)
    without, _ = loss_of([[-1.0, -2.0]], [[-1.0, -2.0]], None, [1.0], clip=0.2, kl_coef=0.0)
    k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(0.5) - 0.5 - 1]
    assert float(with_kl.loss) - float(without.loss) == pytest.approx(0.1 * sum(k3) / 2)


def test_padding_is_masked_and_the_mean_is_over_the_minibatch_tokens():
    # two rollouts, 1 and 2 real tokens; n_tokens = 3 (the minibatch's): loss = -(1*1 + 2*1 + 2*1)/3
    parts, grad = loss_of([[0.0, float("-inf")], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]], None, [1.0, 2.0],
                          mask=[[1, 0], [1, 1]], clip=0.2, kl_coef=0.0)
    assert float(parts.loss) == pytest.approx(-5 / 3)
    assert grad.flatten().tolist() == pytest.approx([-1 / 3, 0.0, -2 / 3, -2 / 3])
    # micro-batches backpropagated one at a time add up to the same token mean
    half, _ = loss_of([[0.0, 0.0]], [[0.0, 0.0]], None, [2.0], clip=0.2, kl_coef=0.0, n_tokens=3.0)
    assert float(half.loss) == pytest.approx(-4 / 3)


def test_token_logprobs_are_log_softmax_at_the_sampling_temperature():
    logits = torch.tensor([[[2.0, 0.0, -1.0]]])
    got = token_logprobs(logits, torch.tensor([[0]]), temperature=0.5)
    z = torch.tensor([4.0, 0.0, -2.0])
    assert float(got) == pytest.approx(float(z[0] - torch.logsumexp(z, 0)))


def test_importance_weights_are_truncated_ratios_and_the_sampler_kl_is_their_mean_log():
    # pi_old (0.5, 0.2, 0.3) against the sampler's q (0.25, 0.8, unknown): ratios 2 and 0.25,
    # the first truncated at the cap 1.5, the unknown one 1; KL(q || pi_old) ~ log(q / pi_old)
    # summed over the known tokens: log 0.5 + log 4 = log 2 over 2 tokens
    old = torch.log(torch.tensor([[0.5, 0.2, 0.3]]))
    sampler = torch.tensor([[math.log(0.25), math.log(0.8), float("nan")]])
    weights, kl_sum, count = importance_weights(old, sampler, torch.ones(1, 3), cap=1.5)
    assert weights[0].tolist() == pytest.approx([1.5, 0.25, 1.0])
    assert float(kl_sum) == pytest.approx(math.log(2.0)) and int(count) == 2
    none, kl_sum, count = importance_weights(old, sampler, torch.tensor([[1.0, 0.0, 1.0]]), cap=None)
    assert none is None and float(kl_sum) == pytest.approx(math.log(0.5)) and int(count) == 1  # masked out


def test_importance_weights_scale_the_policy_term_and_not_the_kl():
    args = ([[-1.0, -2.0]], [[-1.0, -2.0]], None, [1.0])
    plain, plain_grad = loss_of(*args, clip=0.2, kl_coef=0.0)
    ones, _ = loss_of(*args, clip=0.2, kl_coef=0.0, weights=torch.ones(1, 2))
    half, half_grad = loss_of(*args, clip=0.2, kl_coef=0.0, weights=torch.tensor([[0.5, 2.0]]))
    assert float(ones.loss) == pytest.approx(float(plain.loss)) == pytest.approx(-1.0)
    assert float(half.loss) == pytest.approx(-(0.5 + 2.0) / 2)
    assert (half_grad / plain_grad)[0].tolist() == pytest.approx([0.5, 2.0])
    # A = 0: only the KL is left, whatever the weights
    kl, _ = loss_of([[-1.0]], [[-1.0]], [[-2.0]], [0.0], clip=0.2, kl_coef=0.5, weights=torch.zeros(1, 1))
    assert float(kl.loss) == pytest.approx(0.5 * math.exp(-1.0))
