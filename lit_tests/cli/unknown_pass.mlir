// Unknown autosp passes (in a pipeline or as a flag), unknown upstream passes and a
// malformed pipeline are errors with exit status 1 and no traceback.
// RUN: not autosp-opt %s --pass-pipeline='builtin.module(autosp-nope)' 2>&1 | FileCheck %s --check-prefix=NOPE
// RUN: not autosp-opt %s --autosp-nope 2>&1 | FileCheck %s --check-prefix=NOPE
// RUN: not autosp-opt %s --pass-pipeline='builtin.module(autosp-dce,no-such-pass)' 2>&1 | FileCheck %s --check-prefix=UPSTREAM
// RUN: not autosp-opt %s --pass-pipeline='builtin.module(autosp-dce' 2>&1 | FileCheck %s --check-prefix=UNBALANCED

// NOPE-NOT: Traceback
// NOPE: error: unknown pass 'autosp-nope' (autosp-opt --list-passes shows the registered passes)
// NOPE-NOT: Traceback
// NOPE-NOT: module

// UPSTREAM-NOT: Traceback
// UPSTREAM: error: invalid pipeline element 'no-such-pass': {{.*}}'no-such-pass' does not refer to a registered pass or pass pipeline
// UPSTREAM-NOT: Traceback

// UNBALANCED-NOT: Traceback
// UNBALANCED: error: missing ')' in pass pipeline
// UNBALANCED-NOT: Traceback
func.func @f() {
  return
}
