// --list-passes names every registered pass with its summary, then points at upstream passes.
// RUN: autosp-opt --list-passes | FileCheck %s
// --help lists the per-pass flags; --print-dialect prints the IRDL file's path.
// RUN: autosp-opt --help | FileCheck %s --check-prefix=HELP
// RUN: autosp-opt --print-dialect | FileCheck %s --check-prefix=DIALECT

// CHECK:      autosp passes:
// The summaries are the passes' own (first docstring line); here only their presence.
// CHECK-NEXT:   autosp-annotate-sequence{{ +}}{{[A-Z].+}}
// CHECK-NEXT:     require-attention (bool, default True)
// CHECK-NEXT:   autosp-causal-conv{{ +}}{{[A-Z].+}}
// CHECK-NEXT:   autosp-causal-mask{{ +}}{{[A-Z].+}}
// CHECK-NEXT:   autosp-checkpoint{{ +}}{{[A-Z].+}}
// CHECK-NEXT:     mode (str, default sac)
// CHECK-NEXT:     layers (str, default )
// CHECK-NEXT:   autosp-dce{{ +}}{{[A-Z].+}}
// CHECK-NEXT:   autosp-fuse-attention{{ +}}{{[A-Z].+}}
// CHECK-NEXT:   autosp-fuse-gqa{{ +}}{{[A-Z].+}}
// CHECK-NEXT:   autosp-hoist-shard{{ +}}{{[A-Z].+}}
// CHECK-NEXT:   autosp-partition-attention{{ +}}{{[A-Z].+}}
// CHECK-NEXT:     sp-size (int, default 2)
// CHECK-NEXT:     group (str, default sp)
// CHECK-NEXT:     strategy (str, default ulysses)
// CHECK-NEXT:     ulysses-degree (int, default 0)
// CHECK-NEXT:     ring-degree (int, default 0)
// CHECK-NEXT:     ranks-per-node (int, default 0)
// CHECK-NEXT:     seq-len (int, default 0)
// CHECK-NEXT:     recurrence (str, default auto)
// CHECK-NEXT:   autosp-relative-bias{{ +}}{{[A-Z].+}}
// CHECK-NEXT:   autosp-shard-sequence{{ +}}{{[A-Z].+}}
// CHECK-NEXT:     group (str, default sp)
// CHECK-NEXT:     gather-outputs (bool, default False)
// CHECK-NEXT:   autosp-sp-pipeline{{ +}}{{[A-Z].+}}
// CHECK-NEXT:     sp-size (int, default 2)
// CHECK-NEXT:     group (str, default sp)
// CHECK-NEXT:     gather-outputs (bool, default False)
// CHECK-NEXT:     strategy (str, default ulysses)
// CHECK-NEXT:     ulysses-degree (int, default 0)
// CHECK-NEXT:     ring-degree (int, default 0)
// CHECK-NEXT:     ranks-per-node (int, default 0)
// CHECK-NEXT:     seq-len (int, default 0)
// CHECK-NEXT:     recurrence (str, default auto)
// CHECK-NEXT:   autosp-tile-loss{{ +}}{{[A-Z].+}}
// CHECK-NEXT:     chunk (int, default 0)
// CHECK-NEXT:     drop-logits (bool, default False)
// CHECK-NEXT:   autosp-tile-tokens{{ +}}{{[A-Z].+}}
// CHECK-NEXT:     tiles (int, default 4)
// CHECK-NEXT: Upstream MLIR and torch-mlir passes {{.*}} are also accepted in --pass-pipeline.

// HELP: usage: autosp-opt
// HELP: --pass-pipeline
// HELP: --split-input-file
// HELP: --verify-diagnostics
// HELP: --autosp-dce
// HELP: --autosp-tile-loss
// HELP: --autosp-tile-tokens
// HELP: --canonicalize

// DIALECT: autosp{{[/\\]}}dialect{{[/\\]}}autosp.irdl.mlir
