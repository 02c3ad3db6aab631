// RUN: autosp-opt %s --split-input-file --autosp-partition-attention=sp-size=2 | FileCheck %s
// RUN: autosp-opt %s --split-input-file --autosp-partition-attention='sp-size=4 recurrence=chain' \
// RUN:   | FileCheck %s --check-prefix=CHAIN

// autosp-partition-attention on the stated recurrences other than Gated DeltaNet and Mamba2
// (partition_attention.mlir has those, with attention beside them): lightning attention,
// mLSTM, Mamba-1's selective scan.

// MiniMax's lightning attention (q, k, v [B, S, H, D], a decay per head, block 64): priced
// (its state decays by one scalar per head, so the prefix costs one more q S product per
// token and a summary of one decay per head), and at S = 8192 on 2 ranks the prefix wins.
// CHECK: autosp.sp_choice = "no attention: recurrences only; recurrences: lightning_attention (4 heads, d_k/N 8, d_v/d_head 8, chunk 64) on 2 ranks: prefix; priced per layer at S=8192: prefix {{.*}} us, chain {{.*}} us
// CHECK-LABEL: func.func @lightning
// CHECK: torch.operator "torch.autosp.lightning_attention"{{.*}}{autosp.scan_method = "prefix"}
// CHAIN-LABEL: func.func @lightning
// CHAIN: torch.operator "torch.autosp.lightning_attention"{{.*}}{autosp.scan_method = "chain"}
func.func @lightning(%q: !torch.vtensor<[2,?,4,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64},
                     %slope: !torch.vtensor<[4],f32> {autosp.input = "args[1]"})
    -> !torch.vtensor<[2,?,4,8],f32> {
  %int64 = torch.constant.int 64
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, s0, 4, 8)> : !torch.vtensor<[2,?,4,8],f32>
  %o = torch.operator "torch.autosp.lightning_attention"(%q, %q, %q, %slope, %int64) : (!torch.vtensor<[2,?,4,8],f32>, !torch.vtensor<[2,?,4,8],f32>, !torch.vtensor<[2,?,4,8],f32>, !torch.vtensor<[4],f32>, !torch.int) -> !torch.vtensor<[2,?,4,8],f32>
  torch.bind_symbolic_shape %o, [%s], affine_map<()[s0] -> (2, s0, 4, 8)> : !torch.vtensor<[2,?,4,8],f32>
  return %o : !torch.vtensor<[2,?,4,8],f32>
}

// -----

// xLSTM's mLSTM: a chain, the only way (its max stabilizer is not linear in the state), and
// the reason says so rather than "not priced".
// CHECK: autosp.sp_choice = "no attention: recurrences only; recurrences: torch.autosp.mlstm: chain (the only way: its max stabilizer is not linear in the state)"
// CHECK-LABEL: func.func @mlstm
// CHECK: torch.operator "torch.autosp.mlstm"{{.*}}{autosp.scan_method = "chain"}
// CHAIN-LABEL: func.func @mlstm
// CHAIN: torch.operator "torch.autosp.mlstm"{{.*}}{autosp.scan_method = "chain"}
func.func @mlstm(%q: !torch.vtensor<[2,?,2,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64},
                 %g: !torch.vtensor<[2,?,2],f32> {autosp.input = "args[1]", autosp.seq_dim = 1 : i64})
    -> !torch.vtensor<[2,?,2,8],f32> {
  %str = torch.constant.str "{\22cls\22: \22transformers.models.xlstm.modeling_xlstm:xLSTMBackend\22}"
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %q, [%s], affine_map<()[s0] -> (2, s0, 2, 8)> : !torch.vtensor<[2,?,2,8],f32>
  torch.bind_symbolic_shape %g, [%s], affine_map<()[s0] -> (2, s0, 2)> : !torch.vtensor<[2,?,2],f32>
  %o = torch.operator "torch.autosp.mlstm"(%q, %q, %q, %g, %g, %str) : (!torch.vtensor<[2,?,2,8],f32>, !torch.vtensor<[2,?,2,8],f32>, !torch.vtensor<[2,?,2,8],f32>, !torch.vtensor<[2,?,2],f32>, !torch.vtensor<[2,?,2],f32>, !torch.str) -> !torch.vtensor<[2,?,2,8],f32>
  torch.bind_symbolic_shape %o, [%s], affine_map<()[s0] -> (2, s0, 2, 8)> : !torch.vtensor<[2,?,2,8],f32>
  return %o : !torch.vtensor<[2,?,2,8],f32>
}

// -----

// Mamba-1's selective scan (x [B, S, d_inner], A [d_inner, N]): priced per channel (a
// diagonal scan: its transition is N per channel, the prefix reads its basis out), the
// prefix from 2 ranks.
// CHECK: autosp.sp_choice = "no attention: recurrences only; recurrences: selective_scan (8 channels, N 4) on 2 ranks: prefix; priced
// CHECK-LABEL: func.func @selective_scan
// CHECK: torch.operator "torch.autosp.selective_scan"{{.*}}{autosp.scan_method = "prefix"}
// CHAIN-LABEL: func.func @selective_scan
// CHAIN: torch.operator "torch.autosp.selective_scan"{{.*}}{autosp.scan_method = "chain"}
func.func @selective_scan(%x: !torch.vtensor<[2,?,8],f32> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64},
                          %bc: !torch.vtensor<[2,?,4],f32> {autosp.input = "args[1]", autosp.seq_dim = 1 : i64},
                          %a: !torch.vtensor<[8,4],f32> {autosp.input = "args[2]"})
    -> !torch.vtensor<[2,?,8],f32> {
  %none = torch.constant.none
  %true = torch.constant.bool true
  %str = torch.constant.str "transformers.models.mamba.modeling_mamba:mamba_selective_scan"
  %s = torch.symbolic_int "s0" {min_val = 2, max_val = 4096} : !torch.int
  torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, s0, 8)> : !torch.vtensor<[2,?,8],f32>
  torch.bind_symbolic_shape %bc, [%s], affine_map<()[s0] -> (2, s0, 4)> : !torch.vtensor<[2,?,4],f32>
  %o = torch.operator "torch.autosp.selective_scan"(%x, %x, %a, %bc, %bc, %none, %none, %none, %true, %str) : (!torch.vtensor<[2,?,8],f32>, !torch.vtensor<[2,?,8],f32>, !torch.vtensor<[8,4],f32>, !torch.vtensor<[2,?,4],f32>, !torch.vtensor<[2,?,4],f32>, !torch.none, !torch.none, !torch.none, !torch.bool, !torch.str) -> !torch.vtensor<[2,?,8],f32>
  torch.bind_symbolic_shape %o, [%s], affine_map<()[s0] -> (2, s0, 8)> : !torch.vtensor<[2,?,8],f32>
  return %o : !torch.vtensor<[2,?,8],f32>
}
