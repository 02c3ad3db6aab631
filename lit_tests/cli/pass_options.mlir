// Pass options are written as in MLIR: separated by spaces, a list option's items by
// commas, in braces in a pipeline or after '=' in a pass flag.
// RUN: autosp-opt %s --pass-pipeline='builtin.module(autosp-sp-pipeline{sp-size=1 group=g gather-outputs=true})' --mlir-print-ir-after-all 2>&1 | FileCheck %s
// RUN: autosp-opt %s --autosp-sp-pipeline='sp-size=1 group=g gather-outputs' --mlir-print-ir-after-all 2>&1 | FileCheck %s
// RUN: autosp-opt %s --autosp-sp-pipeline="{sp-size=1 group='g'}" --mlir-print-ir-after-all 2>&1 | FileCheck %s
// CHECK-NOT: error
// CHECK:     IR Dump After autosp-dce
// CHECK:     func.func @f

// The comma-separated form is diagnosed with the spelling to use.
// RUN: not autosp-opt %s --pass-pipeline='builtin.module(autosp-sp-pipeline{sp-size=1,group=g})' 2>&1 | FileCheck %s --check-prefix=COMMA
// RUN: not autosp-opt %s --autosp-sp-pipeline=sp-size=1,group=g 2>&1 | FileCheck %s --check-prefix=COMMA
// COMMA-NOT: Traceback
// COMMA:     error: options of pass 'autosp-sp-pipeline' are separated by spaces, as in MLIR: '{sp-size=1 group=g}', not '{sp-size=1,group=g}'

// Values are typed: an int option given a word, and an sp-size below 1.
// RUN: not autosp-opt %s --autosp-sp-pipeline='sp-size=two' 2>&1 | FileCheck %s --check-prefix=TYPE
// RUN: not autosp-opt %s --autosp-sp-pipeline='sp-size=0' 2>&1 | FileCheck %s --check-prefix=ZERO
// TYPE:      error: option 'sp-size' of pass 'autosp-sp-pipeline' expects int, got 'two'
// ZERO:      error: option 'sp-size' of pass 'autosp-sp-pipeline' must be >= 1, got 0

// Upstream options go to MLIR unchanged (its own syntax is the same).
// RUN: autosp-opt %s --pass-pipeline='builtin.module(canonicalize{max-iterations=2 region-simplify=disabled})' | FileCheck %s --check-prefix=UP
// UP: func.func @f
func.func @f(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %0 = torch.aten.neg %arg0 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  return %arg0 : !torch.vtensor<[4],f32>
}
