// IR dumps and timings go to stderr; the module still goes to stdout.
// RUN: autosp-opt %s --autosp-dce --canonicalize --mlir-print-ir-after-all 2>&1 >/dev/null | FileCheck %s --check-prefix=AFTER
// RUN: autosp-opt %s --autosp-dce --canonicalize --mlir-print-ir-before=canonicalize 2>&1 >/dev/null | FileCheck %s --check-prefix=BEFORE
// RUN: autosp-opt %s --autosp-dce --cse --mlir-timing 2>&1 >/dev/null | FileCheck %s --check-prefix=TIMING
// RUN: autosp-opt %s --autosp-dce --mlir-print-ir-after-all 2>/dev/null | FileCheck %s --check-prefix=STDOUT

// AFTER:      // -----// IR Dump After autosp-dce //----- //
// AFTER-NEXT: module {
// AFTER-NOT:  torch.aten.neg
// AFTER:      // -----// IR Dump After canonicalize //----- //
// AFTER-NEXT: module {

// BEFORE-NOT: IR Dump Before autosp-dce
// BEFORE:     // -----// IR Dump Before canonicalize //----- //
// BEFORE-NOT: torch.aten.neg
// BEFORE-NOT: IR Dump

// TIMING: // autosp-dce: {{[0-9.]+}} ms
// TIMING: // func.func(cse): {{[0-9.]+}} ms

// STDOUT-NOT: IR Dump
// STDOUT:     func.func @f
func.func @f(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %0 = torch.aten.neg %arg0 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  return %arg0 : !torch.vtensor<[4],f32>
}
