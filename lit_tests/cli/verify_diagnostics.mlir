// --verify-diagnostics: expectations that match succeed silently (exit 0), in every
// spelling: same line, @+N, @-N, @above, @below, and notes.
// RUN: autosp-opt %s --split-input-file --verify-diagnostics 2>&1 | FileCheck %s --allow-empty
// CHECK-NOT: error

func.func @plus_one(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  // expected-error@+1 {{does not satisfy the constraint}}
  %0 = "autosp.all_reduce"(%arg0) {reduce_op = "prod", group = "sp"} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %0 : !torch.vtensor<[4],f32>
}

// -----

func.func @minus_one(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %0 = "autosp.all_reduce"(%arg0) {reduce_op = "prod", group = "sp"} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  // expected-error@-1 {{'"prod"'}}
  return %0 : !torch.vtensor<[4],f32>
}

// -----

func.func @above_below(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %0 = "autosp.all_reduce"(%arg0) {reduce_op = "prod", group = "sp"} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  // expected-error@above {{does not satisfy}}
  return %0 : !torch.vtensor<[4],f32>
}

// -----

// expected-error@below {{custom op 'torch.bogus' is unknown}}
%0 = torch.bogus

// -----

%0 = torch.bogus // expected-error {{custom op 'torch.bogus' is unknown}}

// -----

func.func @with_note(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  // expected-error@+2 {{attribute "group" is expected but not provided}}
  // expected-note@+1 {{see current operation}}
  %0 = "autosp.all_reduce"(%arg0) {reduce_op = "sum"} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %0 : !torch.vtensor<[4],f32>
}

// -----

// A chunk without errors and without expectations is fine.
func.func @valid() {
  return
}
