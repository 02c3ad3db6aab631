"""FSDP2 + SP parity on the GPU machine (run by bench/gpu_check.sh under torchrun, one rank
per visible GPU; on CPU with gloo for a dry run here):

    torchrun --standalone --nproc-per-node N bench/gpu_fsdp_check.py [--device cuda] [--out FILE]

A Llama-like model (fp32, GQA) sharded with the FSDP2 recipe (``fully_shard`` on each
block, then the root) over the N ranks, ``autosp.compile`` over the same N ranks (SP = N;
with one GPU, SP 1: the per-layer unshard, prefetch and re-gather still run, on NCCL), 3
AdamW steps at S = 257 (not divisible by N > 1) against the unsharded model trained on one
device: loss each step and every gradient (``grad.full_tensor()``) within 1e-4, TF32 off.
Also the per-group collective counts and the most groups unsharded at once. Rank 0 prints
a markdown table (and appends it to ``--out``); exit status 1 on a mismatch.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import autosp  # noqa: E402
from autosp.models import LlamaConfig, LlamaLike  # noqa: E402
from autosp.testing.parity import relative_error  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=120),
                            init_method=None if "MASTER_ADDR" in os.environ else "tcp://127.0.0.1:29555",
                            rank=rank, world_size=world)
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = LlamaLike(LlamaConfig(vocab=256, hidden=128, layers=3, heads=4, kv_heads=2, ffn=344)).to(device)
    reference = copy.deepcopy(model)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    sp = autosp.compile(model)
    opt, ref_opt = torch.optim.AdamW(model.parameters(), lr=1e-3), torch.optim.AdamW(reference.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    losses, grads = [], []
    for _ in range(3):
        ids = torch.randint(0, 256, (2, 257), generator=gen).to(device)
        loss = sp(ids, labels=ids)["loss"]
        loss.backward()
        ref = reference(ids, labels=ids)["loss"]
        ref.backward()
        losses.append(relative_error(loss.detach(), ref.detach()))
        grads.append(max(relative_error(p.grad.full_tensor(), q.grad)
                         for p, q in zip(model.parameters(), reference.parameters())))
        opt.step(), ref_opt.step()
        opt.zero_grad(), ref_opt.zero_grad()
    program = sp.programs[0]
    log = program.last_unsharder.log
    counts = sorted({(log.count(("all_gather", "forward", k)), log.count(("all_gather", "backward", k)),
                      log.count(("reduce_scatter", "backward", k))) for k in program.unshard_order})
    ok = max(losses) <= 1e-4 and max(grads) <= 1e-4 and counts == [(1, 1, 1)]
    verdict = torch.tensor([0 if ok else 1], device=device)
    dist.all_reduce(verdict)
    if rank == 0:
        name = torch.cuda.get_device_name() if cuda else "cpu"
        text = ("\n| FSDP2 + SP check | value |\n|---|---|\n"
                f"| ranks (FSDP = SP) | {world} ({name}) |\n"
                f"| loss rel. err per step | {', '.join(f'{x:.1e}' for x in losses)} |\n"
                f"| max grad rel. err per step | {', '.join(f'{x:.1e}' for x in grads)} |\n"
                f"| per group (all-gather fwd, bwd, reduce-scatter) | {counts} over {len(program.unshard_order)} groups |\n"
                f"| groups unsharded at once | {program.last_unsharder.max_unsharded} |\n"
                f"| verdict | {'ok' if verdict.item() == 0 else 'FAIL'} |\n")
        print(text, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(text)
    dist.destroy_process_group()
    return 0 if verdict.item() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
