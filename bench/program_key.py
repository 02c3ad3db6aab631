"""Cost of the program key's module-state part per call, against a compiled step.

    python bench/program_key.py [--repeats 200] [--steps 5] [--threads 1]

Every compiled call walks the model (:func:`autosp.program_key.module_state_key`) to see
whether the Python state the program baked in (PEFT's switches, a dropout's ``p``, config
flags, train/eval) changed. This measures, per call, on one process (sp_size=1, the CPU):

* ``key``: :func:`module_state_key` alone;
* ``hit path``: what a call in the previous call's state pays for it in
  ``AutospModule._program_for``: the key and its comparison with the previous call's (the
  program table is keyed by the state's number, the ranks' check by its memoised checksum);
* ``modes walk``: the walk it replaces (``_modes()`` before: every ``training`` flag, in the key
  and in the ranks' check), for scale;
* ``checksum``: the ``repr`` + CRC of a key, once per new state (the ranks' check);
* ``step``: a compiled forward + backward (autosp.compile, median of ``--steps`` after one
  warm-up call that compiles).

Models (Hugging Face transformers, random weights): a 4-layer Llama with PEFT LoRA on every
attention and MLP projection (hidden 256, S 512), and a 32-layer tiny Llama (hidden 64, S 256)
with and without LoRA. Prints one table (times in microseconds / milliseconds, the ratio of
the hit path to the step).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import autosp  # noqa: E402
from autosp.program_key import key_fingerprint, module_state_key  # noqa: E402


def _llama(layers: int, hidden: int, lora: bool):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1024, hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 8 * 8,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=4096, use_cache=False)
    model = LlamaForCausalLM(cfg)
    if lora:
        from peft import LoraConfig, get_peft_model
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets, lora_dropout=0.05))
    return model


def _median_us(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def measure(name: str, model, seq: int, repeats: int, steps: int) -> dict:
    modules = sum(1 for _ in model.modules())
    key_us = _median_us(lambda: module_state_key(model), repeats)
    last = module_state_key(model)

    def hit():  # as AutospModule._program_for on a call in the previous call's state
        return module_state_key(model) == last

    hit_us = _median_us(hit, repeats)
    modes_us = _median_us(lambda: tuple(m.training for m in model.modules()), repeats)
    fingerprint_us = _median_us(lambda: key_fingerprint(module_state_key(model)), max(repeats // 10, 3)) - key_us
    sp = autosp.compile(model)
    ids = torch.randint(0, 1024, (1, seq))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sp(input_ids=ids, labels=ids).loss.backward()  # compiles
        times = []
        for _ in range(steps):
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            sp(input_ids=ids, labels=ids).loss.backward()
            times.append(time.perf_counter() - start)
    step_ms = statistics.median(times) * 1e3
    assert len(sp.programs) == 1, "a second call must not compile again"
    return dict(name=name, modules=modules, key_us=key_us, hit_us=hit_us, modes_us=modes_us,
                fingerprint_us=fingerprint_us, step_ms=step_ms, ratio=hit_us / (step_ms * 1e3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cases = [("llama 4L h256 + LoRA (7 proj), S 512", lambda: _llama(4, 256, True), 512),
             ("llama 32L h64, S 256", lambda: _llama(32, 64, False), 256),
             ("llama 32L h64 + LoRA (7 proj), S 256", lambda: _llama(32, 64, True), 256)]
    rows = [measure(name, make(), seq, args.repeats, args.steps) for name, make, seq in cases]
    print(f"torch {torch.__version__}, {args.threads} thread(s), CPU, sp_size=1")
    print("| model | modules | key (us) | hit path (us) | modes walk (us) | checksum, per new state (us) "
          "| step (ms) | hit path / step |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['modules']} | {r['key_us']:.0f} | {r['hit_us']:.0f} | {r['modes_us']:.0f} | "
              f"{r['fingerprint_us']:.0f} | {r['step_ms']:.1f} | {100 * r['ratio']:.2f} % |")


if __name__ == "__main__":
    main()
