// --list-passes names every registered pass with its summary, then points at upstream passes.
// RUN: autosp-opt --list-passes | FileCheck %s
// --help lists the per-pass flags; --print-dialect prints the IRDL file's path.
// RUN: autosp-opt --help | FileCheck %s --check-prefix=HELP
// RUN: autosp-opt --print-dialect | FileCheck %s --check-prefix=DIALECT

// CHECK:      autosp passes:
// CHECK-NEXT:   autosp-annotate-sequence{{ +}}Mark every dimension that is the sequence
// CHECK-NEXT:     require-attention (bool, default True)
// CHECK-NEXT:   autosp-causal-mask{{ +}}Replace an SDPA mask computed from the sequence length alone
// CHECK-NEXT:   autosp-checkpoint{{ +}}Plan activation checkpointing
// CHECK-NEXT:     mode (str, default sac)
// CHECK-NEXT:   autosp-dce{{ +}}Erase torch ops
// CHECK-NEXT:   autosp-partition-attention{{ +}}Wrap each attention op in Ulysses all-to-alls
// CHECK-NEXT:     sp-size (int, default 2)
// CHECK:      Upstream MLIR and torch-mlir passes {{.*}} are also accepted in --pass-pipeline.

// HELP: usage: autosp-opt
// HELP: --pass-pipeline
// HELP: --split-input-file
// HELP: --verify-diagnostics
// HELP: --autosp-dce
// HELP: --canonicalize

// DIALECT: autosp{{[/\\]}}dialect{{[/\\]}}autosp.irdl.mlir
