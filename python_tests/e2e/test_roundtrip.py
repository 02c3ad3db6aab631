"""compile(model, sp_size=1) is an exact round trip: outputs and gradients equal eager."""
import copy
import subprocess
import sys

import pytest
import torch
from battery import BATTERY

import autosp
from autosp.backend.fx_emitter import emit_graph_module
from autosp.backend.module import CompiledProgram
from autosp.frontend import read_arguments
from autosp.ir.core import parse_module
from autosp.testing.parity import parity, relative_error

TOL = 1e-5


def _compiled_pair(name):
    factory, make, seq_dim = BATTERY[name]
    model = factory()
    reference = copy.deepcopy(model)
    return reference, autosp.compile(model, seq_dim=seq_dim), make


@pytest.mark.parametrize("name", sorted(BATTERY))
def test_battery_matches_eager_at_several_lengths(name):
    """One compilation serves S = 8, 16 and 40; each matches eager (outputs and grads)."""
    reference, compiled, make = _compiled_pair(name)
    for s in (8, 16, 40):
        args, kwargs = make(s)
        report = parity(reference, compiled, *args, **kwargs)
        assert report.max_error <= TOL, f"S={s}: {report}"
        assert report.grads, "no gradient was compared"
    assert len(compiled.programs) == 1, "a new sequence length must not recompile"


def _perturb(gm: torch.fx.GraphModule) -> None:
    """Scale the result of the first matmul-like node by 1.001: a small, wrong change."""
    targets = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default,
               torch.ops.aten.matmul.default, torch.ops.aten.convolution.default}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in targets:
            with gm.graph.inserting_after(node):
                scaled = gm.graph.call_function(torch.ops.aten.mul.Tensor, (node, 1.001))
            node.replace_all_uses_with(scaled, delete_user_cb=lambda u, scaled=scaled: u is not scaled)
            gm.recompile()
            return
    raise AssertionError("no matmul to perturb")


@pytest.mark.parametrize("name", ["llama_gqa_tied", "gpt2_manual_attention", "causal_conv_lm"])
def test_negative_control_perturbed_graph_fails_parity(name):
    reference, compiled, make = _compiled_pair(name)
    args, kwargs = make(16)
    assert parity(reference, compiled, *args, **kwargs).max_error <= TOL
    _perturb(compiled.programs[0].graph_module)
    report = parity(reference, compiled, *args, **kwargs)
    assert report.max_error > 1e-4, f"perturbed graph still passed: {report}"


def test_gradients_land_on_the_users_parameters():
    reference, compiled, make = _compiled_pair("llama_gqa_tied")
    args, kwargs = make(12)
    compiled(*args, **kwargs)["loss"].backward()
    user_params = list(compiled.module.parameters())
    assert all(p.grad is not None for p in user_params)
    assert [id(p) for p in compiled.parameters()] == [id(p) for p in user_params]


def test_optimizer_steps_match_eager():
    # SGD with momentum: Adam's first steps are ~lr * sign(grad), which turns the 1e-7
    # rounding differences of gradients that are ~0 (e.g. a key bias) into +-lr steps.
    reference, compiled, make = _compiled_pair("llama_gqa_tied")
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.5, momentum=0.9)
    opt = torch.optim.SGD(compiled.parameters(), lr=0.5, momentum=0.9)
    reference_start = {n: p.detach().clone() for n, p in reference.named_parameters()}
    for _ in range(3):
        args, kwargs = make(10)
        for model, o in ((reference, opt_ref), (compiled, opt)):
            o.zero_grad()
            model(*args, **kwargs)["loss"].backward()
            o.step()
    for (n, p), q in zip(reference.named_parameters(), compiled.module.parameters()):
        assert relative_error(q, p) <= 1e-5, n
        assert not torch.equal(p, reference_start[n]), f"{n} did not train"


def test_other_input_structures_compile_separately():
    reference, compiled, make = _compiled_pair("llama_gqa_tied")
    ids = make(8)[0][0]
    with_labels = compiled(ids, labels=ids)
    without = compiled(ids)
    assert set(with_labels) == {"logits", "loss"} and set(without) == {"logits"}
    assert len(compiled.programs) == 2
    torch.testing.assert_close(without["logits"], reference(ids)["logits"], rtol=TOL, atol=1e-6)


def test_identity_pipeline_through_autosp_opt_round_trips(tmp_path):
    """import -> file -> `autosp-opt --autosp-dce` -> parse -> emit: still equals eager."""
    reference, compiled, make = _compiled_pair("llama_gqa_tied")
    args, kwargs = make(16)
    imported = autosp.import_model(compiled.module, *args, **kwargs)
    src = tmp_path / "llama.mlir"
    src.write_text(str(imported.module))
    out = tmp_path / "out.mlir"
    opt = [sys.executable, "-m", "autosp.tools.opt"]
    subprocess.run(opt + [str(src), "--autosp-dce", "-o", str(out)], check=True)
    module = parse_module(out.read_text(), str(out))
    assert [a.name for a in read_arguments(module)] == [a.name for a in imported.args]
    program = CompiledProgram(emit_graph_module(module), read_arguments(module), imported.out_spec,
                              imported.tensor_leaves)

    class FromFile(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.module = model

        def forward(self, *a, **k):
            from torch.utils import _pytree as pytree
            return program(self.module, pytree.tree_flatten((a, k))[0])

    args, kwargs = make(24)
    report = parity(reference, FromFile(compiled.module), *args, **kwargs)
    assert report.max_error <= TOL, str(report)
