// A failing pass always prints a command that reproduces it. The module before the
// failing pass is saved only when asked for: --mlir-pass-pipeline-crash-reproducer=FILE,
// $AUTOSP_REPRODUCER_DIR (a folder) or --dump-dir (pipeline_failure.mlir).

// Not asked for: no file anywhere (not even in TMPDIR), and the command runs the whole
// pipeline on this input file.
// RUN: rm -rf %t.tmp && mkdir -p %t.tmp
// RUN: env TMPDIR=%t.tmp not autosp-opt %s --autosp-dce --pass-pipeline='builtin.module(torch-verify-linalg-on-tensors-backend-contract)' 2>&1 | FileCheck %s --check-prefix=NONE
// RUN: %python -c "import os, sys; sys.exit(len(os.listdir(sys.argv[1])))" %t.tmp
// NONE-NOT:   Traceback
// NONE:       reproducer.mlir:[[# @LINE + 31]]:1: error: failed to legalize operation 'func.func'
// NONE:       note: pass 'torch-verify-linalg-on-tensors-backend-contract' failed; reproduce with:
// NONE-NEXT:  autosp-opt --pass-pipeline='builtin.module(autosp-dce, torch-verify-linalg-on-tensors-backend-contract)' {{.*}}reproducer.mlir{{$}}
// NONE-NEXT:  note: to save the module before the failing pass, set AUTOSP_REPRODUCER_DIR=<dir> (autosp-opt: --mlir-pass-pipeline-crash-reproducer=<file>)
// NONE-NOT:   autosp_repro_

// From stdin the input file is a placeholder.
// RUN: not autosp-opt --autosp-dce --pass-pipeline='builtin.module(torch-verify-linalg-on-tensors-backend-contract)' < %s 2>&1 | FileCheck %s --check-prefix=STDIN
// STDIN:      reproduce with:
// STDIN-NEXT: autosp-opt --pass-pipeline='builtin.module(autosp-dce, torch-verify-linalg-on-tensors-backend-contract)' <input.mlir>{{$}}

// A file: the module after autosp-dce, before the failing pass, and the rest of the pipeline.
// RUN: rm -f %t.repro.mlir
// RUN: not autosp-opt %s --autosp-dce --pass-pipeline='builtin.module(torch-verify-linalg-on-tensors-backend-contract)' --mlir-pass-pipeline-crash-reproducer=%t.repro.mlir 2>&1 | FileCheck %s --check-prefix=FILE
// RUN: FileCheck %s --input-file %t.repro.mlir --check-prefix=SAVED
// Running the printed command on the saved file fails the same way.
// RUN: not autosp-opt %t.repro.mlir --pass-pipeline='builtin.module(torch-verify-linalg-on-tensors-backend-contract)' 2>&1 | FileCheck %s --check-prefix=AGAIN
// FILE:       reproduce with:
// FILE-NEXT:  autosp-opt --pass-pipeline='builtin.module(torch-verify-linalg-on-tensors-backend-contract)' {{.*}}repro.mlir --mlir-print-ir-after-all
// FILE-NOT:   to save the module
// SAVED:      // autosp reproducer: the module before 'torch-verify-linalg-on-tensors-backend-contract' failed.
// SAVED-NEXT: // autosp-opt --pass-pipeline='builtin.module(torch-verify-linalg-on-tensors-backend-contract)' {{.*}}repro.mlir
// SAVED:      func.func @f
// SAVED-NOT:  torch.aten.neg
// AGAIN:      error: failed to legalize operation 'func.func'

// A folder from the environment.
// RUN: rm -rf %t.dir
// RUN: env AUTOSP_REPRODUCER_DIR=%t.dir not autosp-opt %s --autosp-dce --pass-pipeline='builtin.module(torch-verify-linalg-on-tensors-backend-contract)' 2>&1 | FileCheck %s --check-prefix=ENV
// ENV:        autosp-opt --pass-pipeline='builtin.module(torch-verify-linalg-on-tensors-backend-contract)' {{.*}}.dir{{[/\\]}}autosp_repro_{{.*}}.mlir --mlir-print-ir-after-all

func.func @f(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %0 = torch.aten.neg %arg0 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  return %arg0 : !torch.vtensor<[4],f32>
}
