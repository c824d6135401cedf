"""Filling a meta model from a safetensors file, tensor by tensor, each straight into the
form and the place it will run in, so a load's peak memory is the final model plus a block.

- a tensor kept in the file's dtype is a view of the file's mapping (no copy);
- a converted one (bf16 from fp32) is read a block of rows at a time into its final tensor;
- with `quant` ("int8"), every Linear's weight and the embedding are quantized a block of
  rows at a time: no fp32 copy of them ever exists;
- in the decode layout, the LM head's matrix is stored column-major, and each module's
  FUSED Linears (q/k/v, gate/up) are read straight into consecutive rows of one matrix,
  the one a step multiplies by. (They used to be read apart and then copied together: the
  separate copies, freed in between other tensors, stayed resident as holes in glibc's
  heap: 108 MB of a bf16 load of the default model, 43 MB of an int8 one.)
- an int8 load given the rows and scales a past load made (`weights.PreparedCache`, mapped)
  reads and quantizes none of them: each is a view of that mapping, or, fused, copied into
  its rows of the one matrix and its pages given back. One that was not returns what it
  quantized, for the caller to keep.

`checkpoint.model_from_file` checks the file against the config, keeps the digest and int8
caches and turns read errors into a `ModelLoadError`; this module only reads and places.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import BinaryIO, TypeAlias

import torch
from torch import Tensor, nn

from agent.runtime.layers import adopt_fused_
from agent.runtime.quant import Int8Embedding, Int8Linear, adopt_fused_int8_, int8_linear, quantize_rows
from agent.runtime import weights
from agent.runtime.weights import Digest, MappedFile, TensorInfo, blocks, read_tensor


# A `weights.PreparedCache` hit: name -> a view of the mapped file, the mapping, name -> its TensorInfo.
Prepared: TypeAlias = tuple[dict[str, Tensor], MappedFile, dict[str, TensorInfo]]


def scale_name(weight_name: str) -> str:
    """Where an int8 weight's row scales sit: beside it, as its module's `scale` buffer."""
    return weight_name.rpartition(".")[0] + ".scale"


def _quantized(modules: dict[str, nn.Module], embed: nn.Module | None, name: str) -> bool:
    """Whether an int8 load keeps `name` as int8 rows and scales: every Linear's weight, and
    the embedding's (`modules`, `embed`: the meta model's, taken before any is replaced)."""
    owner, _, leaf = name.rpartition(".")
    module = modules.get(owner)
    return leaf == "weight" and (type(module) is nn.Linear or (module is not None and module is embed))


def int8_rows(model: nn.Module, infos: dict[str, TensorInfo]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """What an int8 load of the meta `model` makes from `infos` (name -> (shape, dtype)):
    each quantized weight's int8 rows and its fp32 scales, as `weights.PreparedCache` keeps them."""
    modules, embed = dict(model.named_modules()), getattr(model, "embed", None)
    out: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    for name, info in infos.items():
        if _quantized(modules, embed, name):
            out[name] = (tuple(info.shape), torch.int8)
            out[scale_name(name)] = (tuple(info.shape[:1]), torch.float32)
    return out


@dataclass
class FusedRows:
    """One module's FUSED Linears as consecutive rows of one matrix (int8 with its scales),
    allocated before any of them is read."""

    owner: nn.Module
    names: tuple[str, ...]
    weight: Tensor  # [sum of out_features, in_features]
    scale: Tensor | None  # int8: [sum of out_features] fp32
    rows: dict[str, slice] = field(default_factory=dict)  # weight name in the file -> its rows

    def adopt(self) -> None:
        """Make the Linears views of these rows and record the group for `layers.project`."""
        if self.scale is None:
            adopt_fused_(self.owner, self.names, self.weight)
        else:
            adopt_fused_int8_(self.owner, self.names, Int8Linear(self.weight, self.scale, None))


def plan_fused(model: nn.Module, infos: dict[str, TensorInfo], *, dtype: torch.dtype, quant: str | None) -> dict[str, FusedRows]:
    """file weight name -> its group, for each module whose FUSED Linears can be one matrix:
    plain and bias-free, of one input width, stored as floats (as `layers.fuse_linears_`
    requires of loaded ones)."""
    out: dict[str, FusedRows] = {}
    for owner_name, module in model.named_modules():
        names = getattr(module, "FUSED", None)
        if not names:
            continue
        mods = [getattr(module, n, None) for n in names]
        keys = [f"{owner_name}.{n}.weight" if owner_name else f"{n}.weight" for n in names]
        if not all(type(m) is nn.Linear and m.bias is None for m in mods) or len({m.in_features for m in mods}) != 1:  # type: ignore[union-attr]
            continue
        if not all(k in infos and infos[k].dtype.is_floating_point for k in keys):
            continue
        total = sum(m.out_features for m in mods)  # type: ignore[union-attr]
        width = mods[0].in_features  # type: ignore[union-attr]
        group = FusedRows(module, tuple(names), torch.empty(total, width, dtype=torch.int8 if quant else dtype),
                          torch.empty(total, dtype=torch.float32) if quant else None)
        start = 0
        for k, m in zip(keys, mods):
            group.rows[k] = slice(start, start + m.out_features)  # type: ignore[union-attr]
            start += m.out_features  # type: ignore[union-attr]
            out[k] = group
    return out


def fill_model(model: nn.Module, f: BinaryIO, infos: dict[str, TensorInfo], *, dtype: torch.dtype, quant: str | None,
               decode_layout: bool, digest: Digest | None, mapped: MappedFile | None,
               prepared: Prepared | None = None) -> dict[str, Tensor]:
    """Put every tensor `infos` names (read from `f`, or viewed in `mapped`) into the meta
    `model`, in `dtype` or with `quant`; feed `digest` (if any) in name order.

    `prepared` (int8): the rows and scales a past load made (`int8_rows`), used instead of
    reading and quantizing; only with no `digest` to feed, as they skip the fp32 bytes.
    Returns what this load quantized (`int8_rows`' names; empty on a hit or without
    `quant`): views of the model's own tensors, for the caller to keep."""
    if prepared is not None and digest is not None:
        raise ValueError("prepared int8 rows skip the fp32 weights: the digest must be known already")
    modules, embed = dict(model.named_modules()), getattr(model, "embed", None)
    made: dict[str, Tensor] = {}
    head = "lm_head.weight" if getattr(model, "lm_head", None) is not None else "embed.weight"
    fused = plan_fused(model, infos, dtype=dtype, quant=quant) if decode_layout else {}
    plain: dict[str, Tensor] = {}
    # One read buffer and one buffer for quantizing's temporaries, for every tensor (pages
    # only count once touched: a load that converts nothing never touches them).
    raw = torch.empty(weights.BLOCK_BYTES, dtype=torch.uint8)
    work = torch.empty(weights.BLOCK_BYTES // 4, dtype=torch.float32)
    head_copy = _mapped_head(infos.get(head), mapped, dtype) if decode_layout else None
    for name in sorted(infos):  # weights_digest's order
        info = infos[name]
        owner = name.rpartition(".")[0]
        module = modules.get(owner)
        group = fused.get(name)
        if quant is None or not _quantized(modules, embed, name):
            keep = dtype if info.dtype.is_floating_point else info.dtype
            into = group.weight[group.rows[name]] if group is not None else None
            column_major = decode_layout and name == head
            if mapped is not None and info.dtype == keep and MappedFile.can_map(info):
                view = mapped.tensor(info)  # a view of the file: no copy, nothing read yet
                if digest is not None:
                    digest.tensor(name, view)
                if into is not None:  # copied into its fused rows: the file's rows leave the RSS
                    plain[name] = into.copy_(view)
                    mapped.release(info)
                elif column_major and head_copy is not None:
                    plain[name] = head_copy
                    if digest is not None:
                        mapped.release(info)  # read again for the digest: given back again
                else:
                    plain[name] = view
            else:
                plain[name] = read_tensor(f, info, keep, digest, column_major=column_major and into is None, out=into,
                                          scratch=raw)
            continue
        if prepared is not None:
            q, scale = _prepared_rows(prepared, name, group)
        else:
            if group is not None:
                q, scale = group.weight[group.rows[name]], group.scale[group.rows[name]]  # type: ignore[index]
            else:
                q, scale = torch.empty(info.shape, dtype=torch.int8), torch.empty(info.shape[0], dtype=torch.float32)
            if digest is not None:
                digest.begin(name, info.shape, torch.float32)
            for r, block in blocks(f, info, torch.float32, scratch=raw):
                if digest is not None:
                    digest.update(block)
                quantize_rows(block, q[r : r + block.shape[0]], scale[r : r + block.shape[0]], work=work)
            made[name], made[scale_name(name)] = q, scale
        if module is embed:
            model.embed = Int8Embedding(q, scale)
            if model.lm_head is None:  # tied: the head is an int8 Linear over the same rows
                model.lm_head = int8_linear(q, scale, None)
        else:  # a Linear's bias sorts before its weight, so it is already read
            parent, _, attr = owner.rpartition(".")
            setattr(model.get_submodule(parent), attr, int8_linear(q, scale, plain.pop(owner + ".bias", None)))
    if quant is None:
        model.load_state_dict(plain, strict=True, assign=True)
    else:  # int8 modules have no state_dict entries of these names: the rest set one by one
        for name, t in plain.items():
            owner, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(owner), leaf, nn.Parameter(t) if t.is_floating_point() else t)
    plain.clear()
    for group in {id(g): g for g in fused.values()}.values():
        group.adopt()
    return made


def _prepared_rows(prepared: Prepared, name: str, group: FusedRows | None) -> tuple[Tensor, Tensor]:
    """(int8 rows, scales) of weight `name` from a cache hit: views of the mapped cache, or,
    for a fused weight, its rows of the group's matrix, copied from the mapping, whose
    pages are then given back (the fused copy is what runs)."""
    tensors, mapped, infos = prepared
    q, scale = tensors[name], tensors[scale_name(name)]
    if group is None:
        return q, scale
    rows = group.rows[name]
    into_q, into_scale = group.weight[rows], group.scale[rows]  # type: ignore[index]
    into_q.copy_(q)
    into_scale.copy_(scale)
    for key in (name, scale_name(name)):
        mapped.release(infos[key])
    return into_q, into_scale


def _mapped_head(info: TensorInfo | None, mapped: MappedFile | None, dtype: torch.dtype) -> Tensor | None:
    """The decode layout's column-major copy of the LM head's matrix, when it is copied from
    the mapping (kept in the file's dtype), else None (then it is read column-major). Made
    before any other weight is placed: the copy touches all of the matrix's file pages
    before they are given back (108 MB on the default model), so made in name order it
    would sit beside every fused copy made before it (a 721 MB peak for a 642 MB load)."""
    if info is None or mapped is None or info.dtype != dtype or len(info.shape) != 2 or not MappedFile.can_map(info):
        return None
    # One copy, made by torch's blocked transpose (a row-by-row fill of a column-major
    # tensor took 3x as long; one block of rows at a time, 1.5-2.5x).
    out = mapped.tensor(info).t().contiguous().t()
    mapped.release(info)  # the copy is what runs: the file's rows leave the RSS
    return out
