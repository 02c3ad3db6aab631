// RUN: autosp-opt %s | FileCheck %s
// The printed form parses again and prints the same.
// RUN: autosp-opt %s | autosp-opt | FileCheck %s

// All autosp ops parse, verify and print back (generic form, attributes sorted).
// Results may have a different shape than the operand (except all_reduce).
// CHECK-LABEL: func.func @all_ops
// CHECK-SAME:    (%[[X:[^:]*]]: !torch.vtensor<[2,4,?,8],f32>, %[[S:[^:]*]]: !torch.int)
// CHECK:         %[[A:.*]] = "autosp.all_to_all"(%[[X]], %[[S]]) {concat_dim = 2 : i64, group = "sp", seq_dim = 2 : i64, split_dim = 1 : i64} : (!torch.vtensor<[2,4,?,8],f32>, !torch.int) -> !torch.vtensor<[2,1,?,8],f32>
// CHECK-NEXT:    %[[E:.*]] = "autosp.all_to_all"(%[[X]]) {concat_dim = 0 : i64, group = "sp", seq_dim = -1 : i64, split_dim = 1 : i64} : (!torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[8,1,?,8],f32>
// CHECK-NEXT:    %[[G:.*]] = "autosp.all_gather"(%[[A]], %[[S]]) {dim = 2 : i64, group = "sp", lo = 0 : i64, trim = 1 : i64} : (!torch.vtensor<[2,1,?,8],f32>, !torch.int) -> !torch.vtensor<[2,1,?,8],f32>
// CHECK-NEXT:    %[[R:.*]] = "autosp.all_reduce"(%[[G]]) {group = "sp", reduce_op = "sum"} : (!torch.vtensor<[2,1,?,8],f32>) -> !torch.vtensor<[2,1,?,8],f32>
// CHECK-NEXT:    %[[RS:.*]] = "autosp.reduce_scatter"(%[[X]]) {dim = 1 : i64, group = "sp", reduce_op = "max"} : (!torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[2,1,?,8],f32>
// CHECK-NEXT:    %[[SH:.*]] = "autosp.shard"(%[[X]], %[[S]]) {dim = 2 : i64, group = "tp", lo = 1 : i64, trim = 0 : i64} : (!torch.vtensor<[2,4,?,8],f32>, !torch.int) -> !torch.vtensor<[2,4,?,8],f32>
// CHECK-NEXT:    %[[W:.*]] = "autosp.rewindow"(%[[SH]], %[[S]]) {dim = 2 : i64, group = "tp", lo = 1 : i64, new_lo = 1 : i64, new_trim = 1 : i64, trim = 0 : i64} : (!torch.vtensor<[2,4,?,8],f32>, !torch.int) -> !torch.vtensor<[2,4,?,8],f32>
// CHECK-NEXT:    %[[L:.*]] = "autosp.local_len"(%[[S]]) {group = "sp", lo = 0 : i64, trim = 1 : i64} : (!torch.int) -> !torch.int
// CHECK-NEXT:    return %[[RS]], %[[W]], %[[L]]
func.func @all_ops(%arg0: !torch.vtensor<[2,4,?,8],f32>, %s: !torch.int) -> (!torch.vtensor<[2,1,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.int) {
  %0 = "autosp.all_to_all"(%arg0, %s) {split_dim = 1 : i64, concat_dim = 2 : i64, seq_dim = 2 : i64, group = "sp"} : (!torch.vtensor<[2,4,?,8],f32>, !torch.int) -> !torch.vtensor<[2,1,?,8],f32>
  %e = "autosp.all_to_all"(%arg0) {split_dim = 1 : i64, concat_dim = 0 : i64, seq_dim = -1 : i64, group = "sp"} : (!torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[8,1,?,8],f32>
  %1 = "autosp.all_gather"(%0, %s) {dim = 2 : i64, lo = 0 : i64, trim = 1 : i64, group = "sp"} : (!torch.vtensor<[2,1,?,8],f32>, !torch.int) -> !torch.vtensor<[2,1,?,8],f32>
  %2 = "autosp.all_reduce"(%1) {reduce_op = "sum", group = "sp"} : (!torch.vtensor<[2,1,?,8],f32>) -> !torch.vtensor<[2,1,?,8],f32>
  %3 = "autosp.reduce_scatter"(%arg0) {dim = 1 : i64, reduce_op = "max", group = "sp"} : (!torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[2,1,?,8],f32>
  %4 = "autosp.shard"(%arg0, %s) {dim = 2 : i64, lo = 1 : i64, trim = 0 : i64, group = "tp"} : (!torch.vtensor<[2,4,?,8],f32>, !torch.int) -> !torch.vtensor<[2,4,?,8],f32>
  %5 = "autosp.rewindow"(%4, %s) {dim = 2 : i64, lo = 1 : i64, trim = 0 : i64, new_lo = 1 : i64, new_trim = 1 : i64, group = "tp"} : (!torch.vtensor<[2,4,?,8],f32>, !torch.int) -> !torch.vtensor<[2,4,?,8],f32>
  %6 = "autosp.local_len"(%s) {lo = 0 : i64, trim = 1 : i64, group = "sp"} : (!torch.int) -> !torch.int
  return %3, %5, %6 : !torch.vtensor<[2,1,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.int
}

// reduce_op accepts "min" as well, and other element types work.
// CHECK-LABEL: func.func @reduce_min_bf16
// CHECK:         "autosp.all_reduce"(%{{.*}}) {group = "sp", reduce_op = "min"} : (!torch.vtensor<[3],bf16>) -> !torch.vtensor<[3],bf16>
func.func @reduce_min_bf16(%arg0: !torch.vtensor<[3],bf16>) -> !torch.vtensor<[3],bf16> {
  %0 = "autosp.all_reduce"(%arg0) {reduce_op = "min", group = "sp"} : (!torch.vtensor<[3],bf16>) -> !torch.vtensor<[3],bf16>
  return %0 : !torch.vtensor<[3],bf16>
}
