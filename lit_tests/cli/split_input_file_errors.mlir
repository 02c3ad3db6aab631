// An error in one chunk keeps its line number in the whole file, the other chunks are
// still processed and printed, and the exit status is 1.
// RUN: not autosp-opt %s --split-input-file 2>&1 | FileCheck %s
// The same input on stdin is located in <stdin>.
// RUN: not autosp-opt --split-input-file < %s 2>&1 | FileCheck %s --check-prefix=STDIN

// CHECK-NOT: Traceback
// CHECK-DAG: split_input_file_errors.mlir:23:8: error: custom op 'torch.bogus' is unknown
// CHECK-DAG: func.func @good_before
// CHECK-DAG: func.func @good_after
// CHECK-NOT: Traceback

// STDIN: <stdin>:23:8: error: custom op 'torch.bogus' is unknown
func.func @good_before() {
  return
}

// -----

func.func @bad() -> !torch.int {
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %0 = torch.bogus %int1, %int2
  return %0 : !torch.int
}

// -----

func.func @good_after() {
  return
}
