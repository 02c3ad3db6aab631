"""Ulysses attention partitioning: sequence-sharded <-> head-sharded around attention.

For each ``torch.aten.scaled_dot_product_attention`` on ``[B, H, S, D]`` operands, q, k
and v go through ``autosp.all_to_all`` (split heads, concatenate the sequence), attention
runs on ``H/P`` heads over the full sequence, and its output goes back (split the
sequence, concatenate heads): 4 all-to-alls per layer, the Ulysses minimum.

GQA/MQA (``enable_gqa`` with fewer KV heads than query heads): when the KV heads do not
divide by P but divide P, each KV head is repeated ``P / KV`` times first, so every rank
gets the KV head its query heads use. Query heads that do not divide by P, or KV heads
that neither divide nor are divided by P, are diagnosed at the attention op.
"""
from __future__ import annotations

from torch_mlir import ir

from autosp.ir import builders as b
from autosp.ir.core import op_name
from autosp.ir.diagnostics import DiagnosticError
from autosp.ir.sequence import SequenceInfo, sequence_length_value

HEAD_DIM, SEQ_DIM = 1, 2  # of SDPA's [B, H, S, D] operands


def _check_operand(op, value, what: str, info: SequenceInfo) -> tuple[list, str]:
    shape = b.vtensor_shape(value.type)
    if shape is None or len(shape[0]) != 4:
        raise DiagnosticError.at(op, f"{what} must be a rank-4 [batch, heads, seq, head_dim] tensor, "
                                     f"got {value.type}")
    if info.seq_dims(value) != [SEQ_DIM]:
        raise DiagnosticError.at(op, f"{what} {value.type} does not have the sequence at dim 2 "
                                     f"(sequence dims: {info.dims.get(value)})")
    if shape[0][HEAD_DIM] is None:
        raise DiagnosticError.at(op, f"{what} has a dynamic head count; Ulysses needs it static")
    return shape


def partition_sdpa(op, info: SequenceInfo, sp_size: int, group: str, seq_len: ir.Value) -> None:
    """Rewrite one SDPA op as all_to_all -> SDPA on H/P heads -> all_to_all."""
    q, k, v, mask = op.operands[0], op.operands[1], op.operands[2], op.operands[3]
    (q_shape, dtype), (k_shape, _), (v_shape, _) = (_check_operand(op, x, n, info)
                                                    for x, n in ((q, "query"), (k, "key"), (v, "value")))
    heads, kv_heads = q_shape[HEAD_DIM], k_shape[HEAD_DIM]
    if heads % sp_size:
        raise DiagnosticError.at(op, f"query heads ({heads}) are not divisible by sp-size {sp_size}: "
                                     "Ulysses attention gives each rank heads/sp-size heads")
    mask_is_none = not isinstance(mask.owner, ir.Block) and op_name(mask.owner) == "torch.constant.none"
    if not mask_is_none:
        raise DiagnosticError.at(op, "an explicit attn_mask is not supported by Ulysses partitioning yet "
                                     "(use is_causal, or a mask built in the model from positions)")
    repeat = 1
    if kv_heads % sp_size:
        if sp_size % kv_heads:
            raise DiagnosticError.at(op, f"key/value heads ({kv_heads}) neither divide nor are divisible by "
                                         f"sp-size {sp_size}")
        repeat = sp_size // kv_heads

    with ir.InsertionPoint(op), op.location:
        def to_heads(x, shape, reps):
            if reps > 1:
                rep = b.constant_int(reps)
                dim = b.constant_int(HEAD_DIM)
                shape = [shape[0], shape[1] * reps, shape[2], shape[3]]
                x = ir.Operation.create("torch.aten.repeat_interleave.self_int",
                                        results=[b.vtensor_type(shape, dtype)],
                                        operands=[x, rep, dim, b.constant_none()]).result
            local = [shape[0], shape[1] // sp_size, None, shape[3]]
            return b.autosp_op("all_to_all", [x, seq_len], b.vtensor_type(local, dtype), split_dim=HEAD_DIM,
                               concat_dim=SEQ_DIM, seq_dim=SEQ_DIM, group=group)

        new_operands = [to_heads(q, q_shape, 1), to_heads(k, k_shape, repeat), to_heads(v, v_shape, repeat)]
        new_operands += list(op.operands[3:])
        out_shape, out_dtype = b.vtensor_shape(op.results[0].type)
        local_out = [out_shape[0], out_shape[1] // sp_size, None, out_shape[3]]
        attrs = {n: op.attributes[n] for n in op.attributes}
        attention = ir.Operation.create(op_name(op), results=[b.vtensor_type(local_out, out_dtype)],
                                        operands=new_operands, attributes=attrs)
    with ir.InsertionPoint.after(attention), op.location:
        back = b.autosp_op("all_to_all", attention.result,
                           b.vtensor_type([out_shape[0], out_shape[1], None, out_shape[3]], out_dtype),
                           split_dim=SEQ_DIM, concat_dim=HEAD_DIM, seq_dim=SEQ_DIM, group=group)
    # `back` has the old result's type ([B, H, S, D]), so its shape bindings stay valid.
    op.results[0].replace_all_uses_with(back)
    op.erase()


def partition_attention(module, info: SequenceInfo, sp_size: int, group: str = "sp") -> int:
    """Partition every attention op found by the analysis; return how many were rewritten."""
    count = 0
    seq_len = sequence_length_value(module, info) if info.attention else None
    for op, kind in info.attention:
        if kind == "manual":
            raise DiagnosticError.at(op, "manual attention (matmul -> softmax -> matmul) is recognised but "
                                         "not yet partitioned; use F.scaled_dot_product_attention")
        partition_sdpa(op, info, sp_size, group, seq_len)
        count += 1
    return count

