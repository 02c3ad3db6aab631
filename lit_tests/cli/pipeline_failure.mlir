// A failing pass prints its located error and a command that reproduces it; the module
// before the failing pass is saved in the --dump-dir folder.
// RUN: rm -rf %t.dumps
// RUN: not autosp-opt %s --autosp-dce --pass-pipeline='builtin.module(torch-verify-linalg-on-tensors-backend-contract)' --dump-dir %t.dumps 2>&1 | FileCheck %s
// RUN: FileCheck %s --input-file %t.dumps/00_input.mlir --check-prefix=INPUT
// RUN: FileCheck %s --input-file %t.dumps/01_autosp-dce.mlir --check-prefix=DCE

// CHECK-NOT: Traceback
// CHECK: pipeline_failure.mlir:[[# @LINE + 7]]:1: error: failed to legalize operation 'func.func'
// CHECK: note: pass 'torch-verify-linalg-on-tensors-backend-contract' failed; reproduce with:
// CHECK-NEXT: autosp-opt --pass-pipeline='builtin.module(torch-verify-linalg-on-tensors-backend-contract)' {{.*}}autosp_repro_{{.*}}.mlir
// CHECK-NOT: Traceback

// INPUT: torch.aten.neg
// DCE-NOT: torch.aten.neg
func.func @f(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %0 = torch.aten.neg %arg0 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  return %arg0 : !torch.vtensor<[4],f32>
}
