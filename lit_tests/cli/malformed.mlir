// RUN: not autosp-opt %s 2>&1 | FileCheck %s
// A parse error is reported at its location in the input, without a traceback.
// CHECK-NOT: Traceback
// CHECK: {{.*}}malformed.mlir:8:{{[0-9]+}}: error: custom op 'torch.bogus' is unknown
// CHECK-NOT: Traceback
func.func @f(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %int1 = torch.constant.int 1
  %0 = torch.bogus %arg0 : !torch.vtensor<[4],f32>
  return %arg0 : !torch.vtensor<[4],f32>
}
