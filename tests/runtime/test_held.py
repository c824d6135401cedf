"""What a window state holds exactly (agent/runtime/held.py): sinks, window and memory
positions read off hand-made states, and the span questions chat asks of them."""

from __future__ import annotations

import pytest
import torch

from agent.runtime.config import PRESETS, LaplaceConfig
from agent.runtime.held import MEMORY, Held, held_by_transcript_only, held_positions
from agent.runtime.state import RecurrentState

S, W = 2, 4


def window_config() -> LaplaceConfig:
    return LaplaceConfig(name="w", vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_k_dim=8,
                         head_v_dim=8, ffn_dim=48, chunk_size=8, mixer="window", window=W, sinks=S)


def state_after(n: int, memory: list[list[list[int]]] | None = None, batch: int = 1, name: str = MEMORY[0]) -> RecurrentState:
    """A window state that has read `n` tokens (row 0; other rows have read 1000), with
    `memory` [L][G][M] as its slots' positions in tensor `name` when given (-1: an empty slot)."""
    config = window_config()
    state = RecurrentState.zeros(config, batch)
    state.tensors["pos"] = torch.tensor([[n] + [1000] * (batch - 1)])
    state.n_tokens = n
    if memory is not None:
        rows = torch.tensor(memory)[:, None] + 1  # [L, 1, G, M], stored as mem_pos holds them: 1 + position, 0 empty
        other = torch.full_like(rows, 3)  # another row's memory must not leak into row 0's
        state.tensors[name] = torch.cat([rows, *[other] * (batch - 1)], 1)
    return state


def test_sinks_and_window_of_a_state_without_memory() -> None:
    held = held_positions(state_after(20), window_config())
    assert held == Held(n=20, sinks=range(0, 2), window=range(16, 20), memory=())
    assert [p for p in range(22) if held.holds(p)] == [0, 1, 16, 17, 18, 19]


@pytest.mark.parametrize("n, sinks, window", [(0, range(0, 0), range(2, 0)), (1, range(0, 1), range(2, 1)),
                                              (5, range(0, 2), range(2, 5)), (6, range(0, 2), range(2, 6)),
                                              (7, range(0, 2), range(3, 7))], ids=lambda v: f"{v}" if isinstance(v, int) else "")
def test_a_short_stream_is_held_whole(n: int, sinks: range, window: range) -> None:
    held = held_positions(state_after(n), window_config())
    assert (held.sinks, held.window) == (sinks, window)
    # Up to S + W tokens read, the state holds every one (the teacher exactly); one more, and
    # the first token after the sinks has left.
    assert [p for p in range(n) if not held.holds(p)] == ([] if n <= S + W else [S])
    assert not held.holds(n)  # not read yet


def test_memory_positions_are_sorted_distinct_and_skip_empty_slots() -> None:
    # Two layers, two kv heads, three slots each: positions repeat across layers and heads.
    memory = [[[9, -1, 5], [5, 11, -1]], [[-1, -1, -1], [11, 7, 9]]]
    held = held_positions(state_after(20, memory, batch=2), window_config())
    assert held.memory == (5, 7, 9, 11)
    assert [p for p in range(20) if held.holds(p)] == [0, 1, 5, 7, 9, 11, 16, 17, 18, 19]


def test_a_second_memory_group_counts_too() -> None:
    """rest_pos (`memory_rest_slots`' layers, slots of their own count) beside mem_pos: a
    position either holds is held."""
    state = state_after(20, [[[9, -1, 5], [5, 11, -1]]])
    state.tensors[MEMORY[1]] = torch.tensor([[[[7, 0], [0, 13]]]]) + torch.tensor([[[[1, -1], [-1, 1]]]])  # 0: empty
    held = held_positions(state, window_config())
    assert held.memory == (5, 7, 9, 11, 13)


def test_the_engines_state_is_read_as_torchs_is(tmp_path) -> None:
    """Chat on the torch-free engine hands over its numpy state (`native.runner.ArrayState`):
    the same positions as the torch state of the same tokens (a chat crashed on it)."""
    from agent.runtime.native import library
    from agent.runtime.native.runner import EngineRunner, open_engine_model
    from tests.runtime.test_native_engine import saved

    if library() is None:
        pytest.skip("no C compiler: the engine does not run here")
    d, model = saved(tmp_path, False, memory_slots=3, memory_policy="novelty", combine="softmax", window=12)
    ids = torch.randint(0, 264, (70,), generator=torch.Generator().manual_seed(4)).tolist()
    _, engine_state = EngineRunner(open_engine_model(d, weights="fp32").engine).prefill(ids)
    with torch.inference_mode():
        _, torch_state = model(torch.tensor([ids]))
    torch_state.n_tokens = len(ids)
    got, want = held_positions(engine_state, model.config), held_positions(torch_state, model.config)
    assert got == want and got.n == 70 and len(got.memory) >= 3 and all(p < 70 - 12 for p in got.memory)


SPANS = {"in sinks": (1, 3), "gap": (2, 5), "in memory": (4, 6), "gap after memory": (6, 9),
         "ends at window": (12, 16), "touches window": (12, 17), "in window": (17, 20), "unread": (18, 22),
         "empty": (10, 10)}


def test_span_questions_over_sinks_window_and_memory() -> None:
    held = held_positions(state_after(20, [[[5]], [[-1]]]), window_config())
    assert {k for k, (a, b) in SPANS.items() if held.holds_any(a, b)} == {
        "in sinks", "in memory", "touches window", "in window", "unread"}
    assert held_by_transcript_only(held, SPANS) == {"gap", "gap after memory", "ends at window"}
    without = held_positions(state_after(20), window_config())
    assert held_by_transcript_only(without, SPANS) == {"gap", "in memory", "gap after memory", "ends at window"}


def test_a_mixer_without_exact_tokens_is_not_asked() -> None:
    tiny = PRESETS["tiny"]
    assert held_positions(RecurrentState.zeros(tiny), tiny) is None
