"""``python -m autosp.frontend MODEL``: print the torch-dialect import of a reference model.

Used by the lit tests of the importer and handy to look at what autosp starts from::

    python -m autosp.frontend llama --layers 1 --seq 16 -o llama.mlir
"""
from __future__ import annotations

import argparse
import sys
import warnings

import torch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autosp.frontend", description=__doc__.splitlines()[0])
    parser.add_argument("model", help="attention, attention-seq-first, llama, gpt2, alibi or relative-bias")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("-o", dest="output", default="-")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    from autosp.frontend.importer import import_model
    from autosp.ir.diagnostics import AutospError
    from autosp.models import reference_model

    torch.manual_seed(0)
    try:
        model, call_args, kwargs, seq_dim = reference_model(args.model, layers=args.layers, seq=args.seq)
        imported = import_model(model, *call_args, seq_dim=seq_dim, **kwargs)
    except (AutospError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    text = str(imported.module)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
