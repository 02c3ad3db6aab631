// Each chunk is processed on its own and the outputs are joined by `// -----`.
// RUN: autosp-opt %s --split-input-file --autosp-dce | FileCheck %s
// Without --split-input-file the markers are plain comments: one module, three functions.
// RUN: autosp-opt %s --autosp-dce | FileCheck %s --check-prefix=WHOLE

// CHECK:      module {
// CHECK-NEXT:   func.func @first
// CHECK:      // -----
// CHECK-NEXT: module {
// CHECK-NEXT:   func.func @second
// CHECK:      // -----
// CHECK-NEXT: module {
// CHECK-NEXT:   func.func @third
// CHECK-NOT:  // -----

// WHOLE:     module {
// WHOLE:       func.func @first
// WHOLE:       func.func @second
// WHOLE:       func.func @third
// WHOLE-NOT: // -----
func.func @first() {
  return
}

// -----

func.func @second() {
  return
}

// -----

func.func @third() {
  return
}
