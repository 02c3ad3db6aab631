// RUN: autosp-opt %s | FileCheck %s
// The printed form parses again and prints the same.
// RUN: autosp-opt %s | autosp-opt | FileCheck %s

// All five autosp ops parse, verify and print back (generic form, attributes sorted).
// Results may have a different shape than the operand (except all_reduce).
// CHECK-LABEL: func.func @all_ops
// CHECK-SAME:    (%[[X:.*]]: !torch.vtensor<[2,4,?,8],f32>)
// CHECK:         %[[A:.*]] = "autosp.all_to_all"(%[[X]]) {concat_dim = 2 : i64, group = "sp", split_dim = 1 : i64} : (!torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[2,1,?,8],f32>
// CHECK-NEXT:    %[[G:.*]] = "autosp.all_gather"(%[[A]]) {dim = 1 : i64, group = "sp"} : (!torch.vtensor<[2,1,?,8],f32>) -> !torch.vtensor<[2,4,?,8],f32>
// CHECK-NEXT:    %[[R:.*]] = "autosp.all_reduce"(%[[G]]) {group = "sp", reduce_op = "sum"} : (!torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[2,4,?,8],f32>
// CHECK-NEXT:    %[[RS:.*]] = "autosp.reduce_scatter"(%[[R]]) {dim = 1 : i64, group = "sp", reduce_op = "max"} : (!torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[2,1,?,8],f32>
// CHECK-NEXT:    %[[S:.*]] = "autosp.shard"(%[[X]]) {dim = 1 : i64, group = "tp"} : (!torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[2,1,?,8],f32>
// CHECK-NEXT:    return %[[RS]], %[[S]]
func.func @all_ops(%arg0: !torch.vtensor<[2,4,?,8],f32>) -> (!torch.vtensor<[2,1,?,8],f32>, !torch.vtensor<[2,1,?,8],f32>) {
  %0 = "autosp.all_to_all"(%arg0) {split_dim = 1 : i64, concat_dim = 2 : i64, group = "sp"} : (!torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[2,1,?,8],f32>
  %1 = "autosp.all_gather"(%0) {dim = 1 : i64, group = "sp"} : (!torch.vtensor<[2,1,?,8],f32>) -> !torch.vtensor<[2,4,?,8],f32>
  %2 = "autosp.all_reduce"(%1) {reduce_op = "sum", group = "sp"} : (!torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[2,4,?,8],f32>
  %3 = "autosp.reduce_scatter"(%2) {dim = 1 : i64, reduce_op = "max", group = "sp"} : (!torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[2,1,?,8],f32>
  %4 = "autosp.shard"(%arg0) {dim = 1 : i64, group = "tp"} : (!torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[2,1,?,8],f32>
  return %3, %4 : !torch.vtensor<[2,1,?,8],f32>, !torch.vtensor<[2,1,?,8],f32>
}

// reduce_op accepts "min" as well, and other element types work.
// CHECK-LABEL: func.func @reduce_min_bf16
// CHECK:         "autosp.all_reduce"(%{{.*}}) {group = "sp", reduce_op = "min"} : (!torch.vtensor<[3],bf16>) -> !torch.vtensor<[3],bf16>
func.func @reduce_min_bf16(%arg0: !torch.vtensor<[3],bf16>) -> !torch.vtensor<[3],bf16> {
  %0 = "autosp.all_reduce"(%arg0) {reduce_op = "min", group = "sp"} : (!torch.vtensor<[3],bf16>) -> !torch.vtensor<[3],bf16>
  return %0 : !torch.vtensor<[3],bf16>
}
