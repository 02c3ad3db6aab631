// --verify-diagnostics fails (exit 1) on an expectation that is not produced, on an
// error that is not expected, and on the wrong text; each failure is located.
// RUN: not autosp-opt %s --split-input-file --verify-diagnostics 2>&1 | FileCheck %s

// CHECK-NOT: Traceback
func.func @not_produced() {
  // CHECK: verify_diagnostics_failures.mlir:[[# @LINE + 1]]:6: error: expected error "never happens" was not produced
  // expected-error@+1 {{never happens}}
  return
}

// -----

func.func @unexpected(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  // CHECK: verify_diagnostics_failures.mlir:[[# @LINE + 1]]:8: error: unexpected error: '"prod"' does not satisfy the constraint
  %0 = "autosp.all_reduce"(%arg0) {reduce_op = "prod", group = "sp"} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %0 : !torch.vtensor<[4],f32>
}

// -----

func.func @wrong_text(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  // CHECK: verify_diagnostics_failures.mlir:[[# @LINE + 3]]:8: error: unexpected error: '"prod"' does not satisfy the constraint
  // CHECK: verify_diagnostics_failures.mlir:[[# @LINE + 1]]:6: error: expected error "wrong words" was not produced
  // expected-error@+1 {{wrong words}}
  %0 = "autosp.all_reduce"(%arg0) {reduce_op = "prod", group = "sp"} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %0 : !torch.vtensor<[4],f32>
}

// -----

func.func @wrong_line(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  // CHECK: verify_diagnostics_failures.mlir:[[# @LINE + 3]]:8: error: unexpected error: '"prod"'
  // CHECK: verify_diagnostics_failures.mlir:[[# @LINE + 1]]:6: error: expected error "does not satisfy" was not produced
  // expected-error@+2 {{does not satisfy}}
  %0 = "autosp.all_reduce"(%arg0) {reduce_op = "prod", group = "sp"} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %0 : !torch.vtensor<[4],f32>
}
// CHECK-NOT: Traceback
