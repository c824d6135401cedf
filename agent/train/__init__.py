"""Fine-tuning and training: data, Muon/AdamW grouping, the loop, FSDP2 + distributed Muon.

Imports only `agent.runtime` (never sessions or UI code). Submodules are imported where
used, so `from agent.train.initial_state import load_initial_state` stays cheap.
"""

from __future__ import annotations
