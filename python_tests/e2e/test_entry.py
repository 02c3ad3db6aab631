"""The entry enforces the contract (docs/DESIGN.md §7): ranks that pass different inputs,
a later call with other lengths, train/eval switches and launch mistakes give a clear
error or the right program, never a silent wrong answer.

Before: ranks fed different batches (a DistributedSampler) trained on a chimera of them
without a word; a later call with another length aborted inside gloo; ``eval()`` after a
train-mode compile still applied dropout; ``WORLD_SIZE=2`` without a process group ran
every rank alone.
"""
import copy
import os
import time

import pytest
import torch
import torch.nn.functional as F

from autosp.testing.distributed import run_ranks

TOL = 1e-5
VOCAB = 64


class DropoutLM(torch.nn.Module):
    """A small causal LM with dropout after the embedding and after attention."""

    def __init__(self, p=0.1, hidden=32, heads=4):
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(VOCAB, hidden)
        self.drop = torch.nn.Dropout(p)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.out = torch.nn.Linear(hidden, hidden)
        self.head = torch.nn.Linear(hidden, VOCAB)

    def forward(self, ids, labels=None):
        b, s = ids.shape
        x = self.drop(self.embed(ids))
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.out(a.transpose(1, 2).reshape(b, s, -1)))
        logits = self.head(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return out


def _llama():
    from autosp.models import LlamaConfig, LlamaLike
    return LlamaLike(LlamaConfig(vocab=VOCAB, hidden=32, layers=1, heads=4, kv_heads=2))


def _ids(gen, seq=16, batch=2):
    return torch.randint(0, VOCAB, (batch, seq), generator=gen)


def _attempt(fn):
    """(message of the AutospError, seconds) or ("no error", seconds)."""
    from autosp.ir.diagnostics import AutospError
    start = time.monotonic()
    try:
        fn()
        return "no error", time.monotonic() - start
    except AutospError as e:
        return str(e), time.monotonic() - start


# ----------------------------------------------------------------------------- inputs agree
def _disagree_body(rank, world, queue, seed):
    import autosp
    from autosp.testing.parity import parity, relative_error
    torch.manual_seed(seed)
    model = _llama()
    reference = copy.deepcopy(model)
    sp = autosp.compile(model, gather_outputs=True)
    gen = torch.Generator().manual_seed(seed + 1)
    same, other = _ids(gen), _ids(torch.Generator().manual_seed(seed + 2 + rank))
    result = {}
    # Different batches of the same shape (what a DistributedSampler gives).
    result["contents"] = _attempt(lambda: sp(other, labels=other))
    result["after_contents"] = parity(reference, sp, same, labels=same).max_error
    # A later call whose lengths differ (dynamic padding per rank).
    seq = 16 if rank == 0 else 15
    result["lengths"] = _attempt(lambda: sp(same[:, :seq], labels=same[:, :seq]))
    # Rows of one dataset through torch's DistributedSampler: rank r gets its own rows.
    rows = torch.randint(0, VOCAB, (8, 16), generator=torch.Generator().manual_seed(seed + 3))
    sampler = torch.utils.data.DistributedSampler(list(range(8)), num_replicas=world, rank=rank, shuffle=False)
    batch = rows[list(sampler)[:2]]
    result["sampler"] = _attempt(lambda: sp(batch, labels=batch))
    # One rank in eval mode, the other training.
    sp.train(rank == 0)
    result["modes"] = _attempt(lambda: sp(same, labels=same))
    sp.train()
    # One rank under autocast: another program (bf16 messages), refused before any collective.
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=rank == 0):
        result["autocast"] = _attempt(lambda: sp(same, labels=same))
    result["after_all"] = parity(reference, sp, same, labels=same).max_error
    # The opt-out: check_inputs=False trusts the caller, and a chimera of the two batches
    # trains (the negative control: the check above is what catches it).
    unchecked = autosp.compile(model, gather_outputs=True, check_inputs=False)
    unchecked(same, labels=same)  # compiles (the signature's first call is still checked)
    model.zero_grad(set_to_none=True)
    reference.zero_grad(set_to_none=True)
    unchecked(other, labels=other)["loss"].backward()
    reference(other, labels=other)["loss"].backward()
    result["chimera_grad_error"] = max(relative_error(p.grad, q.grad)
                                       for p, q in zip(model.parameters(), reference.parameters()))
    queue.put((rank, result))


def test_ranks_that_disagree_get_one_error_each_call_and_the_module_stays_usable(_fresh_seed):
    results = run_ranks(_disagree_body, 2, args=(_fresh_seed % 10000,), timeout=300, collective_timeout=60)
    for rank, r in results.items():
        message, seconds = r["contents"]
        assert "the contents of args[0] differs across the ranks" in message, f"rank {rank}: {message}"
        assert "rank 0: fingerprint" in message and "rank 1: fingerprint" in message and "autosp.data" in message
        assert seconds < 60
        message, _ = r["lengths"]
        assert "args[0] dim 1 (the sequence) differs" in message and "rank 0: 16, rank 1: 15" in message, message
        assert "the contents of args[0]" in r["sampler"][0], r["sampler"][0]
        assert "the module's train/eval mode differs" in r["modes"][0] and "rank 1: eval" in r["modes"][0]
        assert "the program's state (autocast" in r["autocast"][0] and "bfloat16" in r["autocast"][0], r["autocast"]
        assert r["after_contents"] <= TOL and r["after_all"] <= TOL, "the module must stay usable"
        assert r["chimera_grad_error"] > 0.1, "without the check, different batches must train wrong"


# ----------------------------------------------------------------------------- train / eval
def _modes_body(rank, world, queue, seed):
    import autosp
    from autosp.testing.parity import parity, relative_error
    torch.manual_seed(seed)
    model = DropoutLM()
    reference = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed + 1)
    result = {}
    sp = autosp.compile(model, gather_outputs=True)
    ids, labels = _ids(gen), _ids(gen)
    train_losses = [float(sp(ids, labels=labels)["loss"]) for _ in range(2)]  # compiled in train mode
    sp.eval()
    reference.eval()
    result["eval"] = parity(reference, sp, ids, labels=labels).max_error
    with torch.no_grad():  # an evaluation loop
        result["eval_no_grad"] = relative_error(sp(ids, labels=labels)["loss"], reference(ids, labels=labels)["loss"])
    eval_loss = float(reference(ids, labels=labels)["loss"])
    sp.train()
    train_again = float(sp(ids, labels=labels)["loss"])
    # Without dropout every call would equal the eval loss to rounding; with it, calls differ.
    result["train_applies_dropout"] = max(abs(x - eval_loss) for x in (*train_losses, train_again))
    result["programs"] = len(sp.programs)
    # In train mode each rank draws dropout's whole mask and keeps its part: from the same
    # random state, exactly the single-device step.
    reference.train()
    losses, grads = [], []
    for m in (reference, sp):
        m.zero_grad(set_to_none=True)
        torch.manual_seed(seed + 5)
        loss = m(ids, labels=labels)["loss"]
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad for p in m.parameters()])
    result["train_exact"] = max([relative_error(losses[1], losses[0])] +
                                [relative_error(a, b) for a, b in zip(grads[1], grads[0])])
    # Compiled in eval mode first, then trained: dropout must apply.
    model.eval()
    reference.eval()
    second = autosp.compile(model, gather_outputs=True)
    result["second_eval"] = relative_error(second(ids, labels=labels)["loss"], reference(ids, labels=labels)["loss"])
    second.train()
    result["second_train_applies_dropout"] = max(abs(float(second(ids, labels=labels)["loss"]) - eval_loss)
                                                 for _ in range(3))
    queue.put((rank, result))


@pytest.mark.parametrize("world", [1, 2])
def test_train_and_eval_switch_programs(world, _fresh_seed):
    results = run_ranks(_modes_body, world, args=(_fresh_seed % 10000,), timeout=300)
    for rank, r in results.items():
        assert r["eval"] <= TOL and r["eval_no_grad"] <= TOL and r["second_eval"] <= TOL, f"rank {rank}: {r}"
        # Dropout 0.1 on 32 features moves the loss well above rounding (the control that
        # the eval comparison above could fail).
        assert r["train_applies_dropout"] > 1e-4 and r["second_train_applies_dropout"] > 1e-4, r
        assert r["programs"] == 2, "train() and eval() must each have their program"
        assert r["train_exact"] <= TOL, f"rank {rank}: train-mode dropout off single device by {r['train_exact']:.2e}"


# ----------------------------------------------------------------------------- launch mistakes
def test_world_size_without_a_process_group_is_one_line(monkeypatch):
    import torch.distributed as dist

    import autosp
    assert not dist.is_initialized()
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(autosp.AutospError, match=r"WORLD_SIZE=2 is set .* torch.distributed is not initialised"):
        autosp.compile(_llama())
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(autosp.AutospError, match=r"sp_size=2 needs torch.distributed: launch 2 ranks"):
        autosp.compile(_llama(), sp_size=2)


def test_too_short_a_sequence_names_the_minimum():
    import autosp
    from autosp.api import MIN_SEQ_LEN
    sp = autosp.compile(_llama())
    ids = torch.randint(0, VOCAB, (2, MIN_SEQ_LEN))
    assert torch.isfinite(sp(ids, labels=ids)["loss"])  # the minimum itself runs
    with pytest.raises(autosp.AutospError, match=f"has 2 position\\(s\\); autosp needs at least {MIN_SEQ_LEN}"):
        sp(ids[:, :2], labels=ids[:, :2])


def test_hf_model_with_use_cache_is_called_without_a_cache():
    transformers = pytest.importorskip("transformers")
    import autosp
    from autosp.testing.parity import parity
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(cfg)
    assert model.config.use_cache  # the default the guide's quick start meets
    reference = copy.deepcopy(model)
    sp = autosp.compile(model)
    ids = torch.randint(0, VOCAB, (2, 12))
    report = parity(reference, sp, input_ids=ids, labels=ids, use_cache=False)
    assert report.max_error <= TOL
    out = sp(input_ids=ids, labels=ids)  # no use_cache given: autosp passes use_cache=False
    assert out.past_key_values is None and torch.allclose(out.loss, reference(input_ids=ids, labels=ids).loss)
    with pytest.raises(autosp.AutospError, match="use_cache=True: autosp compiles training and evaluation calls"):
        sp(input_ids=ids, labels=ids, use_cache=True)


class _DataDependent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 8)

    def forward(self, ids):
        x = self.embed(ids)
        if x.sum() > 0:  # control flow on data: torch.export cannot trace it
            return x * 2
        return x


def test_export_failure_is_short_and_keeps_the_trace_in_a_file():
    import autosp
    sp = autosp.compile(_DataDependent())
    with pytest.raises(autosp.AutospError) as info:
        sp(torch.randint(0, VOCAB, (2, 8)))
    message = str(info.value)
    assert message.startswith("torch.export could not trace the model:"), message
    assert len(message.splitlines()) <= 8, message
    assert info.value.__cause__ is None and info.value.__suppress_context__, "no chained traceback wall"
    path = message.rsplit("torch.export's whole trace: ", 1)[1].rstrip(")")
    with open(path) as f:
        assert "Traceback" in f.read()
    os.remove(path)


# ----------------------------------------------------------------------------- the fingerprint
def test_fingerprint_sees_every_change_and_ignores_layout():
    from autosp.inputs import fingerprint
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.int64, torch.int32, torch.float32, torch.bfloat16, torch.float16, torch.bool):
        x = torch.randn(4, 33, generator=gen)
        x = (x > 0) if dtype == torch.bool else (x * 10).to(dtype)
        base = fingerprint(x).tolist()
        assert fingerprint(x.clone()).tolist() == base
        assert fingerprint(x.t().contiguous().t()).tolist() == base, "a strided copy is the same input"
        swapped = x.clone().flatten()
        j = int((swapped != swapped[0]).nonzero()[0])
        swapped[0], swapped[j] = x.flatten()[j], x.flatten()[0]
        assert fingerprint(swapped.view_as(x)).tolist() != base, f"{dtype}: a swap of two elements"
        changed = x.clone().flatten()
        changed[17] = ~changed[17] if dtype == torch.bool else changed[17] + 1
        assert fingerprint(changed.view_as(x)).tolist() != base, f"{dtype}: one element changed"
    big = torch.randint(0, 2**62, (1 << 20,), generator=gen)
    assert all(0 <= v < 2**31 for v in fingerprint(big).tolist()), "int64 arithmetic must not overflow"


# ----------------------------------------------------------------------------- sp_size=1, several ranks
def _data_parallel_only_body(rank, world, queue, seed):
    import torch.distributed as dist

    import autosp
    from autosp.testing.parity import relative_error
    torch.manual_seed(seed)
    model = _llama()
    reference = copy.deepcopy(model)
    sp = autosp.compile(model, sp_size=1)
    batches = [_ids(torch.Generator().manual_seed(seed + 10 + r)) for r in range(world)]
    sp(batches[rank], labels=batches[rank])["loss"].backward()  # each rank its own replica's batch
    for ids in batches:  # the replicas' mean, on one device
        (reference(ids, labels=ids)["loss"] / world).backward()
    own = copy.deepcopy(reference)
    own.zero_grad(set_to_none=True)
    own(batches[rank], labels=batches[rank])["loss"].backward()
    queue.put((rank, dict(mean=max(relative_error(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                                               reference.parameters())),
                          own=max(relative_error(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                                              own.parameters())),
                          world=dist.get_world_size())))


def test_sp_size_one_in_a_larger_world_averages_over_the_replicas(_fresh_seed):
    """Before: with sp_size=1 no rank synchronised gradients, so data-parallel replicas
    drifted apart although sync_data_parallel (default True) promises their average."""
    results = run_ranks(_data_parallel_only_body, 2, args=(_fresh_seed % 10000,), timeout=200)
    for rank, r in results.items():
        assert r["mean"] <= TOL, f"rank {rank}: gradients off the replicas' mean by {r['mean']:.2e}"
        assert r["own"] > 1e-3, "the control: a rank's own gradient is not the mean"


# ----------------------------------------------------------------------------- a loss outside the model
class _LogitsOnly(torch.nn.Module):
    """The Llama-like model without its loss: logits [B, S, V]."""

    def __init__(self):
        super().__init__()
        self.inner = _llama()

    def forward(self, ids):
        return self.inner(ids)["logits"]


def _outside_loss_body(rank, world, queue, seed, strategy):
    import torch.distributed as dist

    import autosp
    from autosp.testing.parity import relative_error
    torch.manual_seed(seed)
    model = _LogitsOnly()
    reference = copy.deepcopy(model)
    sp = autosp.compile(model, sp_strategy=strategy)
    ids = _ids(torch.Generator().manual_seed(seed + 1), seq=15)
    # Labels shifted on the full sequence (the last position predicts nothing), as a user
    # writes them before sharding.
    targets = torch.cat([ids[:, 1:], torch.full((ids.shape[0], 1), -100)], dim=1)
    count = (targets != -100).sum()

    def loss_of(logits, labels):
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum") / count

    result = {}
    for name, shard in (("shard_sequence", sp.shard_sequence), ("contiguous", None)):
        model.zero_grad(set_to_none=True)
        logits = sp(ids)  # this rank's positions, in the module's layout
        if shard is None:  # the negative control: a contiguous chunk, not the layout's pieces
            lo = rank * ids.shape[1] // world
            local = targets[:, lo:lo + logits.shape[1]]
        else:
            local = shard(targets)
        loss = loss_of(logits, local)
        loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total)
        reference.zero_grad(set_to_none=True)
        expected = loss_of(reference(ids), targets)
        expected.backward()
        result[name] = max([relative_error(total, expected.detach())] +
                           [relative_error(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters())])
    result["layout"] = sp.layout.describe()
    queue.put((rank, result))


@pytest.mark.parametrize("strategy", ["ulysses", "ring"])
def test_a_loss_outside_the_model_pairs_labels_with_shard_sequence(strategy, _fresh_seed):
    results = run_ranks(_outside_loss_body, 2, args=(_fresh_seed % 10000, strategy), timeout=200)
    for rank, r in results.items():
        assert r["shard_sequence"] <= TOL, f"rank {rank} ({r['layout']}): {r['shard_sequence']:.2e}"
    if strategy == "ring":  # zigzag: a contiguous chunk of labels meets the wrong logits
        assert max(r["contiguous"] for r in results.values()) > 1e-3, results


_FAKE_CUDA = """
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from autosp import inputs
inputs._CHUNK = 1 << 16  # several chunks
with FakeTensorMode():
    for dtype in (torch.int64, torch.int32, torch.bfloat16, torch.float32, torch.bool):
        fp = inputs.fingerprint(torch.empty(2, 100_000, dtype=dtype, device="cuda"))
        assert fp.device.type == "cuda" and fp.dtype == torch.int64 and tuple(fp.shape) == (3,), (dtype, fp)
print("ok")
"""


def test_fingerprint_runs_on_fake_cuda_tensors():
    """The fingerprint's CUDA path (on the tensor's device, chunked) under FakeTensorMode, in a
    subprocess (an op that reaches the CUDA device guard aborts the process)."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", _FAKE_CUDA], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
