// Unknown options of autosp and upstream passes are reported, whichever way they are given.
// RUN: not autosp-opt %s --autosp-dce=no-such-option=1 2>&1 | FileCheck %s
// RUN: not autosp-opt %s --pass-pipeline='builtin.module(autosp-dce{no-such-option=1})' 2>&1 | FileCheck %s
// RUN: not autosp-opt %s --canonicalize=bogus=1 2>&1 | FileCheck %s --check-prefix=UPSTREAM
// RUN: not autosp-opt %s --pass-pipeline='builtin.module(autosp-dce{a=1}x)' 2>&1 | FileCheck %s --check-prefix=MALFORMED
// RUN: not autosp-opt %s --autosp-checkpoint=mode=bogus 2>&1 | FileCheck %s --check-prefix=MODE

// CHECK-NOT: Traceback
// CHECK: error: pass 'autosp-dce' has no option 'no-such-option'
// CHECK-NOT: Traceback

// MODE-NOT: Traceback
// MODE: error: option 'mode' of pass 'autosp-checkpoint' must be one of sac, sac-min, full, got 'bogus'

// UPSTREAM-NOT: Traceback
// UPSTREAM: error: invalid pipeline element 'canonicalize{bogus=1}': {{.*}}no such option bogus
// UPSTREAM-NOT: Traceback

// MALFORMED-NOT: Traceback
// MALFORMED: error: malformed options '{a=1}x' for pass 'autosp-dce'
// MALFORMED-NOT: Traceback
func.func @f() {
  return
}
