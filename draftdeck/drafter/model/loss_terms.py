"""The mix of each drafted position's loss, as every drafter kind's objective and the LM head take it.

A mix is a weighted sum of named terms, written as `--loss` takes it: `ce+kl`, `0.5*ce+tv`,
`lk_hybrid`. With p the target's distribution at the slot and q the drafter's:

- `ce`: the data's next token, -log q[label];
- `kl`: KL(p || q), the forward KL; `rkl`: KL(q || p), the reverse;
- `jsd`: Jensen-Shannon, (KL(p || m) + KL(q || m)) / 2 with m = (p + q) / 2;
- `tv`: 1 - sum min(p, q), whose complement is the speculative-sampling acceptance rate;
- `nla`: -log sum min(p, q), the LK loss (Samarin et al., arXiv 2602.23881);
- `lk_hybrid`: lambda KL + (1 - lambda) TV, lambda = exp(-eta sg[sum min(p, q)]): KL while the drafter
  is far from the target (alpha small), TV as it gets accepted.

`term_value` is the position-by-position reference, in torch ops with autograd; the chunked head
(`head.py`) computes the same values and their gradients by hand.

Torch-free but for `term_value`: the training parameters parse `--loss` here, and the web process
imports them without torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# every term but ce compares the drafter's distribution with the target's: it needs the teacher
TERMS = ("ce", "kl", "rkl", "jsd", "tv", "nla", "lk_hybrid")
DEFAULT_LK_ETA = 3.0  # speculators' and the LK paper's eta
_TERM = re.compile(r"^\s*(?:(?P<w>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*\*\s*)?(?P<name>[a-z_]+)\s*$")


@dataclass(frozen=True)
class Mix:
    """Each drafted position's loss: sum of weight x term over `terms` (name -> weight, each name once,
    weights > 0); `lk_eta` the eta of `lk_hybrid`."""

    terms: tuple[tuple[str, float], ...] = (("ce", 1.0),)
    lk_eta: float = DEFAULT_LK_ETA

    def weight(self, name: str) -> float:
        return dict(self.terms).get(name, 0.0)

    @property
    def ce(self) -> float:
        return self.weight("ce")

    @property
    def kl(self) -> float:
        return self.weight("kl")

    @property
    def others(self) -> tuple[tuple[str, float], ...]:
        """The terms beyond ce and kl (which the head computes as it always has)."""
        return tuple((n, w) for n, w in self.terms if n not in ("ce", "kl"))

    @property
    def needs_teacher(self) -> bool:
        """Whether a term compares with the target's distribution (every one but ce)."""
        return any(n != "ce" for n, _ in self.terms)


CE_ONLY = Mix()


def as_mix(mix: Mix | tuple[float, float]) -> Mix:
    """`mix` as a `Mix`; a pair (ce_weight, kl_weight), the older form, keeps its meaning."""
    if isinstance(mix, Mix):
        return mix
    ce_w, kl_w = mix
    return Mix(tuple((n, float(w)) for n, w in (("ce", ce_w), ("kl", kl_w)) if w))


def parse_mix(
    text: str, *, ce_weight: float = 1.0, kl_weight: float = 1.0, lk_eta: float = DEFAULT_LK_ETA
) -> Mix:
    """The mix `--loss` names: terms joined by `+`, each `name` or `weight*name`. A bare `ce` or `kl`
    weighs `ce_weight` or `kl_weight` (`ce+kl` as it always was), any other bare term 1."""
    terms: dict[str, float] = {}
    for part in text.split("+"):
        m = _TERM.match(part)
        if m is None or m.group("name") not in TERMS:
            raise ValueError(
                f"loss {text!r}: {part.strip()!r} is not a loss term; give terms from"
                f" {', '.join(TERMS)}, joined by + and each optionally weighted as 0.5*name"
            )
        name = m.group("name")
        if name in terms:
            raise ValueError(f"loss {text!r}: {name} is given twice")
        default = {"ce": ce_weight, "kl": kl_weight}.get(name, 1.0)
        weight = float(m.group("w")) if m.group("w") is not None else default
        if not 0 < weight <= 100:
            raise ValueError(f"loss {text!r}: the weight of {name} must be > 0 and <= 100, not {weight:g}")
        terms[name] = weight
    return Mix(tuple(terms.items()), lk_eta)


def describe_terms(mix: Mix, words: dict[str, str]) -> str:
    """The mix in words, `words` naming each term (as run.json records the objective)."""
    return " + ".join(("" if w == 1 else f"{w:g} ") + words.get(n, n) for n, w in mix.terms)


def term_words(mix: Mix) -> dict[str, str]:
    """Each term beyond ce and kl in words, lk_hybrid with the mix's eta."""
    return {
        "rkl": "KL(q_draft || p_target)",
        "jsd": "JSD(p_target, q_draft)",
        "tv": "(1 - sum min(p, q))",
        "nla": "-log sum min(p, q)",
        "lk_hybrid": f"(lambda KL + (1 - lambda) TV, lambda = exp(-{mix.lk_eta:g} sg[sum min(p, q)]))",
    }


def term_value(
    name: str, logp: torch.Tensor, logq: torch.Tensor, lk_eta: float = DEFAULT_LK_ETA
) -> torch.Tensor:
    """(...,) the term `name` (not ce) of each row of the target's log-probabilities `logp` and the
    drafter's `logq` (normalised over the last dimension), with autograd: the reference."""
    import torch  # here: the parameters (and the web process through them) read a mix without torch

    p, q = logp.exp(), logq.exp()
    if name == "kl":
        return (p * (logp - logq)).sum(-1)
    if name == "rkl":
        return (q * (logq - logp)).sum(-1)
    if name == "jsd":
        logm = torch.logaddexp(logp, logq) - math.log(2.0)
        return 0.5 * (p * (logp - logm)).sum(-1) + 0.5 * (q * (logq - logm)).sum(-1)
    alpha = torch.minimum(p, q).sum(-1)
    if name == "tv":
        return 1.0 - alpha
    if name == "nla":
        return -torch.log(alpha)
    if name == "lk_hybrid":
        lam = torch.exp(-lk_eta * alpha.detach())
        return lam * (p * (logp - logq)).sum(-1) + (1.0 - lam) * (1.0 - alpha)
    raise ValueError(f"{name!r} is not a distribution loss; give one of {', '.join(TERMS[1:])}")
