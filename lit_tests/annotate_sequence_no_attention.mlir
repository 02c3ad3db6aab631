// Without attention required, an attention-free model is only annotated.
// RUN: autosp-opt %s --autosp-annotate-sequence=require-attention=false | FileCheck %s --check-prefix=NOATTN
// NOATTN-LABEL: func.func @mlp_only
// NOATTN: torch.aten.neg {{.*}} {autosp.seq = ["_", "S"]}
func.func @mlp_only(%x: !torch.vtensor<[2,?],f32> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64}) -> !torch.vtensor<[2,?],f32> {
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 100} : !torch.int
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],f32>
  %0 = torch.aten.neg %x : !torch.vtensor<[2,?],f32> -> !torch.vtensor<[2,?],f32>
  torch.bind_symbolic_shape %0, [%s], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],f32>
  return %0 : !torch.vtensor<[2,?],f32>
}
