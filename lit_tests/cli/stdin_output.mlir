// Input from stdin (`-` or nothing) and output to a file with -o.
// RUN: autosp-opt - --autosp-dce < %s | FileCheck %s
// RUN: autosp-opt --autosp-dce < %s | FileCheck %s
// RUN: rm -f %t.out.mlir
// RUN: autosp-opt %s --autosp-dce -o %t.out.mlir | FileCheck %s --check-prefix=EMPTY --allow-empty
// RUN: FileCheck %s --input-file %t.out.mlir
// The output parses again.
// RUN: autosp-opt %t.out.mlir | FileCheck %s

// EMPTY-NOT: {{.}}

// CHECK-LABEL: func.func @f
// CHECK-NOT:     torch.constant.int
// CHECK:         return %arg0
func.func @f(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %int3 = torch.constant.int 3
  return %arg0 : !torch.vtensor<[4],f32>
}
