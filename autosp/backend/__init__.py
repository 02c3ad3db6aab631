"""Backend: a transformed torch-dialect module emitted as a ``torch.fx`` program, and the callable that runs it."""
