"""A learned initial recurrent state (`--tune state`): a soft system prompt of exactly one
state's size, and `load_initial_state` for `laplace chat --initial-state PATH`.

Importing this module pulls in only `agent.runtime.state` (not the trainer), so the chat
side can use it cheaply. The file is ordinary `RecurrentState.to_bytes` safetensors bytes
with the base model's fingerprint, so it is refused for any other model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from agent.runtime.state import RecurrentState, StateError, read_state_metadata

STATE_SUFFIX = ".laplace-state"
INITIAL_STATE_FILE = "initial" + STATE_SUFFIX
INITIAL_STATE_KIND = "initial-state"


class InitialState(nn.Module):
    """Each float tensor of a batch-1 state (gla [L, 1, H, K, V], conv [L, 1, D, W], ...) as
    a trainable parameter of the same name, fed to every training row; integer tensors
    (a window model's positions) ride along as buffers."""

    def __init__(self, template: RecurrentState) -> None:
        super().__init__()
        self.names = template.names
        for name, t in template.tensors.items():
            if t.is_floating_point():
                self.register_parameter(name, nn.Parameter(t.detach().clone().float()))
            else:
                self.register_buffer(name, t.detach().clone())

    def expand(self, batch: int) -> RecurrentState:
        # Views, not copies: the gradient of every row sums into the one parameter.
        return RecurrentState({n: getattr(self, n).expand(-1, batch, *getattr(self, n).shape[2:]) for n in self.names})

    def to_state(self) -> RecurrentState:
        return RecurrentState({n: getattr(self, n).detach().clone() for n in self.names})


def save_initial_state(state: RecurrentState, path: str | Path, *, fingerprint: str, extra: dict[str, str] | None = None) -> Path:
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(state.to_bytes(fingerprint=fingerprint, extra={"kind": INITIAL_STATE_KIND, **(extra or {})}))
    tmp.replace(out)
    return out


def load_initial_state(path: str | Path, loaded_model: Any, device: torch.device | str = "cpu") -> RecurrentState:
    """The batch-1 initial state saved by `laplace finetune --tune state`, verified against
    `loaded_model` (a runtime `LoadedModel`). Raises `StateError` subclasses on a corrupt
    file or another model's state, and FileNotFoundError for a missing path."""
    p = Path(path)
    if p.is_dir():
        p = p / INITIAL_STATE_FILE
    data = p.read_bytes()
    read_state_metadata(data)  # format check first: clearer errors than a shape mismatch
    state = RecurrentState.from_bytes(data, config=loaded_model.config, fingerprint=loaded_model.fingerprint, device=device)
    if state.batch_size != 1:
        raise StateError(f"{p} holds {state.batch_size} states; an initial state has exactly one")
    return state
