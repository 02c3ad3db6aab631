// RUN: autosp-opt %s --split-input-file --verify-diagnostics --autosp-checkpoint=mode=sac

// Regions are built around attention: a function without any is diagnosed.
// expected-error@+1 {{has no attention op to checkpoint around}}
func.func @no_attention(%x: !torch.vtensor<[2,?,8],f32>) -> !torch.vtensor<[2,?,8],f32> {
  %0 = torch.aten.neg %x : !torch.vtensor<[2,?,8],f32> -> !torch.vtensor<[2,?,8],f32>
  return %0 : !torch.vtensor<[2,?,8],f32>
}

// -----

// Option layers must name one choice per region. This function has two regions (two
// attention ops) and is valid in mode=sac above; with three choices it is diagnosed on
// the function. (A FileCheck run, not --verify-diagnostics: the expected error would
// not fire in the mode=sac run above.)
// RUN: not autosp-opt %s --split-input-file --autosp-checkpoint=layers=sac,sac,full 2>&1 | FileCheck %s --check-prefix=COUNT
// The chunk above still gets its own error.
// COUNT-DAG: checkpoint_invalid.mlir:{{[0-9]+}}:1: error: 'func.func' op has no attention op to checkpoint around
// COUNT-DAG: checkpoint_invalid.mlir:[[# @LINE + 1]]:1: error: 'func.func' op has 2 checkpoint regions (one per attention layer, the last with the head and loss), but option 'layers' gives 3
func.func @two_regions_three_layers(%x: !torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[2,4,?,8],f32> {
  %none = torch.constant.none
  %float0 = torch.constant.float 0.000000e+00
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %o = torch.aten.scaled_dot_product_attention %x, %x, %x, %none, %float0, %true, %none, %false : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  %h = torch.aten.neg %o : !torch.vtensor<[2,4,?,8],f32> -> !torch.vtensor<[2,4,?,8],f32>
  %o2 = torch.aten.scaled_dot_product_attention %h, %h, %h, %none, %float0, %true, %none, %false : !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.vtensor<[2,4,?,8],f32>, !torch.none, !torch.float, !torch.bool, !torch.none, !torch.bool -> !torch.vtensor<[2,4,?,8],f32>
  return %o2 : !torch.vtensor<[2,4,?,8],f32>
}

// An unknown choice is an error in the pass options, before any IR is read.
// RUN: not autosp-opt %s --autosp-checkpoint=layers=sac,recompute 2>&1 | FileCheck %s --check-prefix=CHOICE
// CHOICE-NOT: Traceback
// CHOICE:     error: option 'layers' of pass 'autosp-checkpoint': 'recompute' is not one of keep, sac, sac-min, full (optionally with '+offload', except keep

// A kept layer recomputes nothing, so it keeps no segment input that could go to the host.
// RUN: not autosp-opt %s --autosp-checkpoint=layers=keep+offload,sac 2>&1 | FileCheck %s --check-prefix=KEEPOFF
// KEEPOFF-NOT: Traceback
// KEEPOFF:     error: option 'layers' of pass 'autosp-checkpoint': 'keep+offload' is not one of {{.*}}except keep: a kept layer recomputes nothing
