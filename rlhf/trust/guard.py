"""Choosing between candidate judgements."""
from __future__ import annotations

from typing import Mapping

from rlhf.trust.judgement import _State


def _head_to_head(a: "_State", b: "_State", counts: Mapping[int, float]) -> "_State":
    """The fixed point more people side with: each rater (counted ``counts[r]``: a new identity
    ``new_weight``, as a swarm of fresh accounts agreeing with itself is not a crowd) backs the one
    its own items agree with more (a tie: half each). Absolute counts ("raters above 0.5") failed
    here: a blurred fixed point that half-agrees with everybody tied with the honest one."""
    for st, other in ((a, b), (b, a)):
        st.support = sum(counts.get(r, 0.0) * (1.0 if st.raw[r] > other.raw[r] else 0.5 if st.raw[r] == other.raw[r]
                                               else 0.0) for r in st.raw if r in other.raw)
    return a if a.support >= b.support else b
