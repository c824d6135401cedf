"""Parameter roles: which of the model's parameters the optimizer grouping gives to Muon.

This is `agent.train.optim.split_parameters`'s rule. It lives in the runtime, next to the
model whose parameter names it reads, because `laplace info` (runtime/info.py) counts the
same parameters and the runtime never imports `agent.train`; both import it from here.
"""

from __future__ import annotations

import torch

BLOCK_MATRIX_ROLES = "q, k, v, output gate, o, GLU"  # what `is_block_matrix` selects, for messages
_BLOCK_MATRIX_SUFFIXES = ("_proj.weight", "w1.weight", "w2.weight", "w3.weight")


def is_block_matrix(name: str, p: torch.Tensor) -> bool:
    """The 2-D matrices inside blocks that Muon trains (q, k, v, output gate, o, GLU);
    everything else (embeddings, LM head, norms, conv, decay gates) goes to AdamW."""
    return name.startswith("blocks.") and p.dim() == 2 and name.endswith(_BLOCK_MATRIX_SUFFIXES)
