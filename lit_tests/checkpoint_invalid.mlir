// RUN: autosp-opt %s --split-input-file --verify-diagnostics --autosp-checkpoint=mode=sac

// Regions are built around attention: a function without any is diagnosed.
// expected-error@+1 {{has no attention op to checkpoint around}}
func.func @no_attention(%x: !torch.vtensor<[2,?,8],f32>) -> !torch.vtensor<[2,?,8],f32> {
  %0 = torch.aten.neg %x : !torch.vtensor<[2,?,8],f32> -> !torch.vtensor<[2,?,8],f32>
  return %0 : !torch.vtensor<[2,?,8],f32>
}
