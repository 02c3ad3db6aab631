"""No rank holds the whole model while compiling: FSDP2 shards are traced as fakes.

Llama-3-8B's shapes (32 layers, bf16), ``fully_shard`` per layer and on the root over a
fake process group of 8 ranks, on the meta device standing for CUDA (the fake-CUDA
harness's convention, autosp/planning/fake_cuda.py: every allocation has its size, none
has memory). :func:`autosp.compile` then compiles rank 0's program; a dispatch mode counts
the device bytes live at once among the tensors created while compiling that a device
would hold (real tensors on the parameters' device; fake tensors hold no storage). The
peak must be at most 1 GiB plus one layer's unsharded parameters.

Negative control: the stand-in of the previous version (``torch.empty`` of each shard's
global shape on its device) must fail the same bound, already with two layers.
Runs in a subprocess: it initialises a fake process group.
"""
import subprocess
import sys

import pytest

_SCRIPT = r'''
import sys
import torch
import torch.distributed as dist
import transformers
from torch._subclasses.fake_tensor import FakeTensor
from torch.multiprocessing.reductions import StorageWeakRef
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import autosp
from autosp.runtime import collectives, fsdp

layers, stand_in = int(sys.argv[1]), sys.argv[2]
if stand_in == "whole":  # the previous version's stand-in: each shard's global shape, allocated
    fsdp.stand_ins = lambda state, dtypes=None: [torch.empty(t.shape, dtype=t.dtype, device=t.to_local().device)
                                                 if fsdp.is_sharded(t) else t for t in state]


class DeviceBytes(TorchDispatchMode):
    """Peak bytes of the storages created while active on ``device`` (fakes hold none;
    a tensor of symbolic size lives inside a trace and is a fake's meta twin)."""

    def __init__(self, device):
        super().__init__()
        self.device, self.live, self.peak = torch.device(device), {}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor) and t.device == self.device and \
                    not any(isinstance(s, torch.SymInt) for s in (*t.shape, t.storage_offset())):
                storage = t.untyped_storage()
                if isinstance(storage.nbytes(), int):  # (a view of a traced storage has a symbolic size)
                    self.live.setdefault(storage._cdata, (StorageWeakRef(storage), storage.nbytes()))
        self.live = {k: v for k, v in self.live.items() if not v[0].expired()}
        self.peak = max(self.peak, sum(n for _, n in self.live.values()))
        return out


dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

config = transformers.AutoConfig.from_pretrained("bench/configs/llama-3-8b.json")
config.num_hidden_layers = layers
with torch.device("meta"):
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
layer_bytes = sum(p.numel() * p.element_size() for p in model.model.layers[0].parameters())
mesh = init_device_mesh("cpu", (8,))
for layer in model.model.layers:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
assert all(fsdp.is_sharded(p) for p in model.parameters())
with collectives.simulate(8, 0):
    sp = autosp.compile(model, sp_size=8)
    ids = torch.zeros(1, 64, dtype=torch.long, device="meta")
    with DeviceBytes("meta") as seen:
        sp.compile_for(ids, labels=ids)
print(f"RESULT {seen.peak} {layer_bytes}")
'''


def _compile_peak(layers: int, stand_in: str) -> tuple[int, int]:
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(layers), stand_in], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT"))
    peak, layer = map(int, line.split()[1:])
    return peak, layer


def _bound(layer_bytes: int) -> int:
    return (1 << 30) + layer_bytes


def test_compiling_an_8b_fsdp2_model_holds_no_whole_model():
    peak, layer = _compile_peak(32, "fake")
    assert layer > 400 << 20  # an 8B layer in bf16 (436 MiB)
    assert peak <= _bound(layer), f"compile peak {peak / 2**30:.2f} GiB > 1 GiB + one layer"


@pytest.mark.parametrize("layers", [2])
def test_negative_control_the_whole_size_stand_in_fails_the_bound(layers):
    peak, layer = _compile_peak(layers, "whole")
    assert peak > _bound(layer), f"the control held only {peak / 2**30:.2f} GiB"
