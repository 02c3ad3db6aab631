// autosp and upstream passes run in one pipeline, in order; the shorthand flags give the
// same result as the textual pipeline.
// RUN: autosp-opt %s --pass-pipeline='builtin.module(autosp-dce,canonicalize,func.func(cse))' | FileCheck %s
// RUN: autosp-opt %s --autosp-dce --canonicalize --cse | FileCheck %s
// RUN: autosp-opt %s --pass-pipeline='builtin.module(autosp-dce)' --cse | FileCheck %s --check-prefix=CSE

// autosp-dce drops the unused neg; cse merges the two equal constants.
// CHECK-LABEL: func.func @mixed
// CHECK-NEXT:    %[[ONE:.*]] = torch.constant.int 1
// CHECK-NEXT:    %[[ADD:.*]] = torch.aten.add.Tensor %arg0, %arg0, %[[ONE]]
// CHECK-NEXT:    return %[[ADD]], %[[ONE]], %[[ONE]]
// CHECK-NEXT:  }

// CSE-LABEL: func.func @mixed
// CSE-NOT:     torch.aten.neg
// CSE:         %[[ONE:.*]] = torch.constant.int 1
// CSE-NOT:     torch.constant.int
// CSE:         return %{{.*}}, %[[ONE]], %[[ONE]]
func.func @mixed(%arg0: !torch.vtensor<[4],f32>) -> (!torch.vtensor<[4],f32>, !torch.int, !torch.int) {
  %int1 = torch.constant.int 1
  %int1_0 = torch.constant.int 1
  %0 = torch.aten.neg %arg0 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %1 = torch.aten.add.Tensor %arg0, %arg0, %int1 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.int -> !torch.vtensor<[4],f32>
  return %1, %int1, %int1_0 : !torch.vtensor<[4],f32>, !torch.int, !torch.int
}
