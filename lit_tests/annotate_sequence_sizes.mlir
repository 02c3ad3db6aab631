// RUN: autosp-opt %s --autosp-annotate-sequence=require-attention=false | FileCheck %s

// Sizes are read exactly from the affine expressions and the integer ops: a*S + b where
// that holds for every S (a constant is not a sequence size), anything else is printed
// as it is (not linear in S) and never rounded to a nearby linear form.
// CHECK-LABEL: func.func @size_forms
func.func @size_forms(%x: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[?,?,?,?,3],f32> {
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int8 = torch.constant.int 8
  %none = torch.constant.none
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],si64>
  // CHECK: %[[S:.*]] = torch.aten.size.int {{.*}} {autosp.seq = "S"}
  %0 = torch.aten.size.int %x, %int1 : !torch.vtensor<[2,?],si64>, !torch.int -> !torch.int
  // S - S is the constant 0: not a sequence size.
  // CHECK: torch.aten.sub.int %[[S]], %[[S]] :
  %1 = torch.aten.sub.int %0, %0 : !torch.int, !torch.int -> !torch.int
  // CHECK: %[[T:.*]] = torch.aten.mul.int {{.*}} {autosp.seq = "2 * S"}
  %2 = torch.aten.mul.int %0, %int2 : !torch.int, !torch.int -> !torch.int
  // CHECK: %[[U:.*]] = torch.aten.sub.int %[[T]], {{.*}} {autosp.seq = "2 * S - 2"}
  %3 = torch.aten.sub.int %2, %int2 : !torch.int, !torch.int -> !torch.int
  // (2S - 2) floordiv 2 is exactly S - 1 (2 divides the S part).
  // CHECK: torch.aten.floordiv.int %[[U]], {{.*}} {autosp.seq = "S - 1"}
  %4 = torch.aten.floordiv.int %3, %int2 : !torch.int, !torch.int -> !torch.int
  // S floordiv 8 is not linear in S.
  // CHECK: torch.aten.floordiv.int %[[S]], {{.*}} {autosp.seq = "S floordiv 8"}
  %5 = torch.aten.floordiv.int %0, %int8 : !torch.int, !torch.int -> !torch.int
  // (S + 7) floordiv 8 * 8 equals S at many lengths, but it is not S.
  // CHECK: torch.aten.empty.memory_format {{.*}} {autosp.seq = ["S - 1", "2 * S - 2", "((S + 7) floordiv 8) * 8", "S ceildiv 4", "_"]}
  %list = torch.prim.ListConstruct %4, %3, %0, %0, %int1 : (!torch.int, !torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %6 = torch.aten.empty.memory_format %list, %none, %none, %none, %none, %none : !torch.list<int>, !torch.none, !torch.none, !torch.none, !torch.none, !torch.none -> !torch.vtensor<[?,?,?,?,3],f32>
  torch.bind_symbolic_shape %6, [%s], affine_map<()[s0] -> (s0 - 1, s0 * 2 - 2, ((s0 + 7) floordiv 8) * 8, s0 ceildiv 4, 3)> : !torch.vtensor<[?,?,?,?,3],f32>
  return %6 : !torch.vtensor<[?,?,?,?,3],f32>
}
