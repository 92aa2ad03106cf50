"""The policy-gradient loss shared by the LoRA trainer and the synthetic GRPO/VPO experiment.

One function, so the experiment in tests/rl/test_rl_synthetic.py exercises exactly the code that
trains the mutator; only the advantages (evolve/rl/advantages.py) differ between GRPO and VPO.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossParts:
    loss: torch.Tensor  # what to backpropagate
    kl: torch.Tensor  # summed per-token KL (k3) over the masked tokens, detached
    clipped: torch.Tensor  # number of masked tokens whose ratio was clipped, detached


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log pi(target_t | context) for every position; logits (B, L, V), targets (B, L).

    The sampler drew tokens at `temperature`, so the policy being optimised is softmax(z / T).
    """
    logits = logits.float() / temperature
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                advantages: torch.Tensor, mask: torch.Tensor, clip: float = 0.2,
                kl_coef: float = 1e-3, n_tokens: float | None = None,
                weights: torch.Tensor | None = None) -> LossParts:
    """PPO-clip policy loss with token-mean aggregation and a KL penalty to the reference.

        r_t   = exp(logp_t - old_t)
        pg_t  = -min(r_t * A, clip(r_t, 1 - eps, 1 + eps) * A)
        kl_t  = exp(ref_t - logp_t) - (ref_t - logp_t) - 1        (k3: unbiased, >= 0)
        loss  = sum_t mask_t * (w_t * pg_t + beta * kl_t) / n_tokens

    Shapes: logp, old_logp, ref_logp, mask (B, L); advantages (B,), every token of a rollout
    gets its rollout's advantage. `n_tokens` is the masked-token count of the whole minibatch,
    so micro-batches that are backpropagated one at a time add up to the token mean.
    `weights` (B, L), detached: the importance weights w_t = min(old_t / sampler_t, cap) that
    correct for the sampler's distribution (top_p) differing from the trainer's; None: w_t = 1.
    """
    mask = mask.to(logp.dtype)
    n_tokens = float(mask.sum()) if n_tokens is None else n_tokens
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip, 1 + clip) * adv
    per_token = -torch.minimum(unclipped, clipped)
    if weights is not None:
        per_token = weights.to(logp.dtype).detach() * per_token
    kl = torch.zeros_like(logp)
    if ref_logp is not None and kl_coef > 0:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + kl_coef * kl
    # where(), not a product: padded positions may hold inf, and inf * 0 is nan.
    real = mask > 0
    loss = torch.where(real, per_token, 0.0).sum() / max(n_tokens, 1.0)
    was_clipped = clipped < unclipped  # the clipped branch is the one taken: no gradient there
    return LossParts(loss=loss, kl=torch.where(real, kl, 0.0).sum().detach(),
                     clipped=(was_clipped & real).sum().detach())


def importance_weights(old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
                       cap: float | None) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Truncated importance weights from the sampler's log-probs, and the sampler-to-trainer KL.

    vLLM sampled each token from q (temperature and top_p applied); the trainer's old policy is
    pi_old (the full softmax at the temperature). Then

        w_t = min(pi_old(t) / q(t), cap)        (1 where the sampler's log-prob is unknown: NaN)
        KL(q || pi_old) ~ mean_t [log q(t) - log pi_old(t)]   over tokens drawn from q (unbiased)

    Returns (weights or None when cap is None, the KL's sum over known tokens, their count).
    """
    known = ~torch.isnan(sampler_logp) & (mask > 0)
    delta = torch.where(known, old_logp.detach().float() - sampler_logp, 0.0)
    kl_sum, count = torch.where(known, -delta, 0.0).sum(), known.sum()
    if cap is None:
        return None, kl_sum, count
    return torch.where(known, torch.exp(delta).clamp(max=cap), 1.0), kl_sum, count
