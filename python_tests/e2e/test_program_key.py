"""The program key sees the Python state a compiled program bakes in (autosp.program_key).

torch.export keeps every plain value ``forward`` read as a constant: PEFT's switches
(``disable_adapter()``, ``merge_adapter()``, ``set_adapter()``), a dropout's ``p``, a config
flag. Before the module state was part of the key, a call after such a change ran the old
program silently: with the adapter disabled it returned the adapter-on loss, after a merge
it counted the LoRA delta twice, after ``set_adapter`` it ran the first adapter. Each check
compares against single-process eager PyTorch on the full sequence (1e-5 relative, fp32),
with a negative control that freezes the module-state key and must fail.
"""
import copy
import os
import subprocess
import sys
import warnings

import pytest
import torch

from autosp.program_key import describe_changes, key_fingerprint, module_state_key
from autosp.testing.distributed import run_ranks

TOL = 1e-5
VOCAB = 96


class _Config:
    """A config object as models hold one (``to_dict``, plain attributes)."""

    def __init__(self):
        self.output_hidden_states = False
        self.labels = {"a", "b", "c"}  # a set: written in one order on every process

    def to_dict(self):
        return dict(vars(self))


class _Tiny(torch.nn.Module):
    """Reads a config flag in forward and applies a dropout whose ``p`` the test changes."""

    def __init__(self):
        super().__init__()
        self.config = _Config()
        self.lin = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.0)

    def forward(self, x):
        h = self.drop(self.lin(x))
        if self.config.output_hidden_states:
            h = h * 2 + 1
        return (h * h).mean()


def _fresh_key(model):
    """The key from a plan built now (the cached plan's key must always equal it)."""
    from autosp import program_key
    program_key._PLANS.pop(model, None)
    return module_state_key(model)


# ----------------------------------------------------------------------------- the key alone
def test_key_sees_dropout_p_config_flags_and_nothing_else():
    model = _Tiny()
    key = module_state_key(model)
    model(torch.randn(2, 5, 8))  # an eager call changes nothing the key holds
    assert module_state_key(model) == key and key_fingerprint(module_state_key(model)) == key_fingerprint(key)

    model.drop.p = 0.25  # in place, as a schedule would
    changed = module_state_key(model)
    assert changed != key and describe_changes(model, key, changed) == ["drop.p: 0.0 -> 0.25"]
    model.drop.p = 0.0
    assert module_state_key(model) == key

    model.config.output_hidden_states = True
    changed = module_state_key(model)
    assert changed != key
    assert describe_changes(model, key, changed) == ["config.output_hidden_states: False -> True"]
    model.config.output_hidden_states = False
    model.eval()
    changed = module_state_key(model)
    assert changed != key and "lin.training: True -> False" in describe_changes(model, key, changed)
    model.train()
    assert module_state_key(model) == key


def test_cached_plan_sees_every_kind_of_change():
    """The per-model plan is an optimisation only: after each change, the key equals one
    from a fresh plan, and differs from the key before."""
    from autosp.models import LlamaConfig, LlamaLike
    model = LlamaLike(LlamaConfig(vocab=VOCAB, hidden=16, layers=2, heads=2, kv_heads=1))
    model.flags = [1, 2]
    model.table = {"x": 1.0}
    layer = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))

    def hook(module, args, out):
        return out

    changes = [
        ("an attribute added", lambda: setattr(model, "new_flag", True)),
        ("a list grown in place", lambda: model.flags.append(3)),
        ("a dict value set in place", lambda: model.table.__setitem__("x", 2.0)),
        ("a float replaced by a tensor", lambda: setattr(model, "new_flag", torch.ones(1))),
        ("a forward hook", lambda: layer.register_forward_hook(hook)),
        ("a child replaced", lambda: setattr(model, "extra", torch.nn.Dropout(0.1))),
        ("a child's class", lambda: setattr(model.extra, "__class__", torch.nn.AlphaDropout)),
        ("a global hook", lambda: torch.nn.modules.module.register_module_forward_pre_hook(hook)),
        ("an instance forward", lambda: setattr(layer, "forward", hook)),
    ]
    handles = []
    try:
        for what, change in changes:
            before = module_state_key(model)
            result = change()
            if result is not None:
                handles.append(result)
            after = module_state_key(model)
            assert after != before, what
            assert after == _fresh_key(model), what
        for handle in handles:  # hooks removed: the key goes back
            handle.remove()
        assert module_state_key(model) == _fresh_key(model)
        assert "forward_hooks" not in repr(module_state_key(model)[1][-1])
    finally:
        for handle in handles:
            handle.remove()


def test_the_cached_plan_does_not_keep_the_model_alive():
    import gc
    import weakref

    from autosp.models import LlamaConfig, LlamaLike
    model = LlamaLike(LlamaConfig(vocab=VOCAB, hidden=16, layers=1, heads=2, kv_heads=1))
    module_state_key(model)
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None


_CHILD = """
import sys
sys.path.insert(0, {root!r})
from autosp.program_key import key_fingerprint, module_state_key
from autosp.models import LlamaConfig, LlamaLike
model = LlamaLike(LlamaConfig(vocab=32, hidden=16, layers=1, heads=2, kv_heads=1))
model.names = {{"q_proj", "k_proj", "v_proj", "o_proj"}}
model.table = {{"z": 1, "a": 2}}
import tempfile
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
fully_shard(model)  # its state sits under an attribute named by a fresh uuid per process
print(key_fingerprint(module_state_key(model)))
dist.destroy_process_group()
"""


def test_fingerprint_is_the_same_in_every_process():
    """The ranks compare the key's checksum: a set of strings (whose order follows the
    process's string hashes) and fully_shard's state attribute (named by a uuid) must not
    make two processes differ."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    prints = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", _CHILD.format(root=root)], env=env, capture_output=True,
                             text=True, timeout=120, check=True)
        prints.add(out.stdout.strip())
    assert len(prints) == 1, prints


def test_compiled_module_recompiles_on_state_changes(capsys):
    """sp_size=1: a changed ``p`` or config flag compiles again (said with verbose, naming
    the attribute), matches eager, and going back reuses the first program."""
    import autosp
    torch.manual_seed(0)
    model = _Tiny()
    reference = copy.deepcopy(model)
    sp = autosp.compile(model, verbose=True)
    x = torch.randn(2, 7, 8)
    for _ in range(2):
        assert torch.allclose(sp(x), reference(x), rtol=TOL)
    assert len(sp.programs) == 1
    capsys.readouterr()
    model.config.output_hidden_states = reference.config.output_hidden_states = True
    assert torch.allclose(sp(x), reference(x), rtol=TOL)
    assert len(sp.programs) == 2
    said = capsys.readouterr().err
    assert "compiling again: the model's state changed since the last call: config.output_hidden_states: " \
           "False -> True" in said, said
    model.config.output_hidden_states = reference.config.output_hidden_states = False
    model.drop.p = 0.5
    torch.manual_seed(1)
    sp(x)  # dropout on: a third program
    assert len(sp.programs) == 3 and "drop.p: 0.0 -> 0.5" in capsys.readouterr().err
    model.drop.p = 0.0
    assert torch.allclose(sp(x), reference(x), rtol=TOL)
    assert len(sp.programs) == 3  # back to the first state: its program


# ----------------------------------------------------------------------------- PEFT at SP 2
def _peft_llama(seed):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, use_cache=False)
    lora = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0,
                init_lora_weights=False)  # random A and B: an adapter that changes the loss
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(**lora))
    model.add_adapter("other", LoraConfig(**lora))
    model.base_model.model.model.norm.weight.requires_grad_(True)  # a gradient also with the adapter off
    return model


def _peft_body(rank, world, queue, seed, frozen_key):
    import contextlib

    import autosp
    from autosp.testing.parity import parity
    if frozen_key:  # negative control: the key's module-state part switched off
        import autosp.api
        real = autosp.api.module_state_key
        first = {}
        autosp.api.module_state_key = lambda model: first.setdefault("key", real(model))
    model = _peft_llama(seed)
    reference = copy.deepcopy(model)
    compiled = autosp.compile(model, gather_outputs=True)
    gen = torch.Generator().manual_seed(seed + 1)

    def check(context=contextlib.nullcontext):
        ids = torch.randint(0, VOCAB, (2, 17), generator=gen)  # fresh inputs, S odd
        with context(model), context(reference):
            report = parity(reference, compiled, input_ids=ids, labels=ids)
        return report.max_error, report.outputs.get("['loss']", float("inf")), len(report.grads)

    result = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result["first"] = check()
        result["disabled"] = check(lambda m: m.disable_adapter())
        result["enabled_again"] = check()
        for m in (model, reference):
            m.merge_adapter()
        result["merged"] = check()
        for m in (model, reference):
            m.unmerge_adapter()
        result["unmerged"] = check()
        for m in (model, reference):
            m.set_adapter("other")
        result["other"] = check()
        result["programs"] = len(compiled.programs)
        if not frozen_key:  # one rank switched its adapter off: refused on both, naming the switch
            from autosp.ir.diagnostics import AutospError
            ids = torch.randint(0, VOCAB, (2, 17), generator=gen)
            with model.disable_adapter() if rank == 1 else contextlib.nullcontext():
                try:
                    compiled(input_ids=ids, labels=ids)
                    result["disagree"] = "no error"
                except AutospError as e:
                    result["disagree"] = str(e)
    queue.put((rank, result))


SCENARIOS = ("disabled", "merged", "other")


def test_peft_switches_after_compile_match_eager(_fresh_seed):
    """disable_adapter(), merge_adapter()/unmerge_adapter() and set_adapter() after a first
    compiled call, at SP 2 on S=17: loss, gathered logits and LoRA gradients as eager on one
    process. Control (the key's module state frozen at the first call): the same calls run
    the first program and are wrong."""
    pytest.importorskip("peft")
    seed = _fresh_seed % 10000
    results = run_ranks(_peft_body, 2, args=(seed, False), timeout=400)
    control = run_ranks(_peft_body, 2, args=(seed, True), timeout=400)
    for rank in (0, 1):
        r, c = results[rank], control[rank]
        for what in ("first", "enabled_again", "unmerged") + SCENARIOS:
            assert r[what][0] <= TOL, f"rank {rank}: {what} off eager by {r[what][0]:.2e} ({r})"
        # gradients compared: the final norm's, and the active adapter's LoRA matrices
        assert r["first"][2] == r["other"][2] == 13 and r["disabled"][2] == r["merged"][2] == 1, r
        assert r["programs"] == 4, r  # adapter on (again after unmerge), off, merged, "other"
        assert "The module state differs" in r["disagree"] and \
            "base_model.model.model.layers.0.self_attn.q_proj._disable_adapters (rank 0: False, rank 1: True)" \
            in r["disagree"], r["disagree"]
        assert c["programs"] == 1 and c["first"][0] <= TOL, c
        for what in SCENARIOS:  # (the loss alone can move little: a doubled LoRA delta moved it 6e-5 once)
            assert max(c[what][0], c[what][1]) > 10 * TOL, \
                f"rank {rank}: the control's logits or loss must be wrong: {what} ({c})"
