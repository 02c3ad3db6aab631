"""AdamW with its state on the host (autosp.runtime.host_optimizer).

* fp32 parameters: 3 steps of ``HostAdamW`` give bit-identical parameters to
  ``torch.optim.AdamW`` (for-loop, foreach and fused, each against the same setting), with
  weight decay, param-group dicts, and a parameter whose grad is None in one step (skipped:
  its step count stays behind, as in AdamW). Negative control: a subclass that does not
  copy the masters back fails that comparison.
* bf16 parameters: after each step they equal, exactly, an fp32 master updated by AdamW
  with the bf16 gradients cast to fp32, rounded to bf16; the masters stay fp32. Why the
  masters: 20 steps each below bf16's resolution move the bf16 parameters, while AdamW
  on the bf16 parameters themselves leaves them where they were.
* an lr set through ``param_groups`` and an LR scheduler on ``opt.inner`` take effect (and
  match AdamW); a state_dict saved after 2 steps (torch.save / torch.load), loaded into a
  fresh model and optimizer, continues bit-identically to an uninterrupted run.
* ``host_bytes``: 4 bytes per element before the first step, 12 after;
  ``zero_grad``; bad ``params`` are refused.
* an FSDP2-style DTensor parameter (1-rank gloo mesh): the local shard is updated, as
  AdamW updates the same values.
The CUDA path (pinned buffers, non-blocking copies) is not exercised here (CPU only).
"""
import io

import pytest
import torch

from autosp.runtime.host_optimizer import HostAdamW

HP = dict(lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
IMPLS = [dict(foreach=False), dict(foreach=True), dict(fused=True)]


class _Net(torch.nn.Module):
    """A small MLP plus ``extra``, a parameter used only when asked (grad None otherwise)."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(dtype)
        self.extra = torch.nn.Parameter(torch.randn(4, dtype=dtype))

    def forward(self, x, use_extra=True):
        y = self.mlp(x)
        return ((y + self.extra) if use_extra else y).square().mean()


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _run(make_opt, steps=3, skip=1, model=None, x=None, lr_at=None, sched=False):
    """Train ``model`` (a fresh _Net by default) ``steps`` steps; ``extra`` has no grad at
    step ``skip``; ``lr_at``: (step, lr) set through param_groups before that step."""
    model = model if model is not None else _Net()
    x = x if x is not None else torch.randn(5, 8)
    opt = make_opt(model)
    sch = torch.optim.lr_scheduler.LambdaLR(getattr(opt, "inner", opt), lambda i: 0.5 ** i) if sched else None
    for i in range(steps):
        if lr_at is not None and i == lr_at[0]:
            for g in opt.param_groups:
                g["lr"] = lr_at[1]
        opt.zero_grad()
        model(x, use_extra=i != skip).backward()
        opt.step()
        if sch is not None:
            sch.step()
    return [p.detach().clone() for p in model.parameters()], opt


def _pair(**run_kw):
    """(HostAdamW result, torch AdamW result) from the same initial model and input."""
    init, x = _Net(), torch.randn(5, 8)

    def fresh():
        m = _Net()
        m.load_state_dict(init.state_dict())
        return m
    impl = run_kw.pop("impl", {"fused": True})  # HostAdamW's default; torch's on CPU is the for-loop
    host = run_kw.pop("cls", HostAdamW)
    a, host_opt = _run(lambda m: host(m.parameters(), **HP, **impl), model=fresh(), x=x, **run_kw)
    b, _ = _run(lambda m: torch.optim.AdamW(m.parameters(), **HP, **impl), model=fresh(), x=x, **run_kw)
    return a, b, host_opt


@pytest.mark.parametrize("impl", IMPLS, ids=lambda d: next(iter(d)) + "=" + str(next(iter(d.values()))))
def test_fp32_bit_identical_to_adamw(impl):
    a, b, opt = _pair(impl=impl)
    assert _same(a, b)
    steps = [int(st["step"]) for st in opt.inner.state.values()]
    assert sorted(steps) == [2] + [3] * 4  # extra skipped once, as AdamW skips it


def test_param_group_dicts():
    def groups(m):
        return [{"params": m.mlp.parameters()}, {"params": [m.extra], "weight_decay": 0.0, "lr": 0.05}]
    init, x = _Net(), torch.randn(5, 8)
    models = [_Net(), _Net()]
    for m in models:
        m.load_state_dict(init.state_dict())
    a, opt = _run(lambda m: HostAdamW(groups(m), **HP), model=models[0], x=x)
    b, _ = _run(lambda m: torch.optim.AdamW(groups(m), **HP, fused=True), model=models[1], x=x)
    assert _same(a, b)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]


def test_negative_control_without_copy_back():
    class NoCopyBack(HostAdamW):
        def _copy_back(self, slots):
            pass
    a, b, _ = _pair(cls=NoCopyBack)
    assert not _same(a, b)
    a, b, opt = _pair(cls=NoCopyBack, steps=1)  # after one step the masters are right, the parameters not
    assert _same([m for g in opt.param_groups for m in g["params"]], b) and not _same(a, b)


def test_bf16_params_follow_fp32_masters():
    model = _Net(torch.bfloat16)
    x = torch.randn(5, 8, dtype=torch.bfloat16)
    ref = [p.detach().float().clone() for p in model.parameters()]
    ref_opt = torch.optim.AdamW(ref, **HP, fused=True)
    opt = HostAdamW(model.parameters(), **HP)
    for i in range(3):
        opt.zero_grad()
        model(x, use_extra=i != 1).backward()
        for r, p in zip(ref, model.parameters()):
            r.grad = None if p.grad is None else p.grad.float()
        ref_opt.step()
        opt.step()
        masters = [m for g in opt.param_groups for m in g["params"]]
        assert all(m.dtype == torch.float32 for m in masters)
        assert _same(masters, ref)
        assert _same([p.detach() for p in model.parameters()], [r.to(torch.bfloat16) for r in ref])
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())


def test_masters_accumulate_updates_below_bf16_resolution():
    # Adam's step under a constant gradient is ~lr = 1e-3 < half of bf16's spacing below 1 (2**-9).
    p = torch.nn.Parameter(torch.ones(64, dtype=torch.bfloat16))
    q = torch.nn.Parameter(torch.ones(64, dtype=torch.bfloat16))
    opts = [HostAdamW([p], lr=1e-3, weight_decay=0.0), torch.optim.AdamW([q], lr=1e-3, weight_decay=0.0)]
    for _ in range(20):
        for t, o in zip((p, q), opts):
            t.grad = torch.ones_like(t)
            o.step()
    assert torch.equal(q.detach(), torch.ones_like(q))  # naive bf16 AdamW: every update rounded away
    assert (p.detach() < 1).all()  # masters at ~0.98: the bf16 parameters moved
    assert torch.allclose(opts[0].param_groups[0]["params"][0], torch.full((64,), 0.98), atol=1e-4)


def test_lr_changes_take_effect():
    a, b, _ = _pair(steps=4, lr_at=(2, 0.2))
    assert _same(a, b)
    init, x = _Net(), torch.randn(5, 8)
    runs = []
    for lr_at in (None, (2, 0.2)):
        m = _Net()
        m.load_state_dict(init.state_dict())
        runs.append(_run(lambda m: HostAdamW(m.parameters(), **HP), steps=4, model=m, x=x, lr_at=lr_at)[0])
    assert not _same(*runs)
    a, b, opt = _pair(steps=4, sched=True)  # LambdaLR on opt.inner
    assert _same(a, b)
    assert opt.param_groups[0]["lr"] == pytest.approx(HP["lr"] * 0.5 ** 4)


def test_state_dict_round_trip_continues_identically():
    init, x = _Net(torch.bfloat16), torch.randn(5, 8, dtype=torch.bfloat16)

    def fresh():
        m = _Net(torch.bfloat16)
        m.load_state_dict(init.state_dict())
        return m
    full, _ = _run(lambda m: HostAdamW(m.parameters(), **HP), steps=4, skip=1, model=fresh(), x=x)
    m1 = fresh()
    _, opt1 = _run(lambda m: HostAdamW(m.parameters(), **HP), steps=2, skip=1, model=m1, x=x)
    buf = io.BytesIO()
    torch.save(opt1.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf, weights_only=True)
    m2 = _Net(torch.bfloat16)  # other weights: load_state_dict writes the masters into them
    opt2 = HostAdamW(m2.parameters(), **HP)
    opt2.load_state_dict(sd)
    assert _same([p.detach() for p in m2.parameters()], [p.detach() for p in m1.parameters()])
    for _ in range(2):
        opt2.zero_grad()
        m2(x).backward()
        opt2.step()
    assert _same([p.detach() for p in m2.parameters()], full)
    with pytest.raises(ValueError, match="masters"):
        opt2.load_state_dict({**sd, "masters": sd["masters"][:1]})


def test_host_bytes_and_zero_grad():
    model = _Net(torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    opt = HostAdamW(model.parameters())
    assert opt.host_bytes == 4 * n and opt.buffer_bytes == 0
    model(torch.randn(5, 8, dtype=torch.bfloat16)).backward()
    opt.step()
    assert opt.host_bytes == 12 * n
    assert opt.buffer_bytes == 4 * n  # fp32 gradients (no staging buffers off CUDA)
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(TypeError):
        HostAdamW(model.extra)
    with pytest.raises(ValueError, match="more than once"):
        HostAdamW([model.extra, model.extra])


def test_dtensor_parameter_updates_its_local_shard():
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed, not yet initialized in this process")
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        w = torch.randn(6, 3)
        p = torch.nn.Parameter(distribute_tensor(w.clone(), DeviceMesh("cpu", [0]), [Shard(0)]))
        q = torch.nn.Parameter(w.clone())
        opts = [HostAdamW([p], **HP), torch.optim.AdamW([q], **HP, fused=True)]
        for _ in range(2):
            for t, o, local in zip((p, q), opts, (p.to_local, lambda: q)):
                t.grad = None
                (local() ** 3).sum().backward()
                o.step()
        assert isinstance(p, DTensor) and isinstance(p.grad, DTensor)
        assert torch.equal(p.to_local(), q.detach())
    finally:
        dist.destroy_process_group()
