// A missing input file, a directory as input and an unwritable -o are clean errors.
// RUN: not autosp-opt %t.does-not-exist.mlir 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not autosp-opt %S 2>&1 | FileCheck %s --check-prefix=DIR
// RUN: not autosp-opt %s -o %S/no-such-dir/out.mlir 2>&1 | FileCheck %s --check-prefix=OUT
// An unknown flag is a usage error (argparse, exit status 2).
// RUN: not autosp-opt %s --no-such-flag 2>&1 | FileCheck %s --check-prefix=USAGE

// MISSING-NOT: Traceback
// MISSING: autosp-opt: error: could not open input file '{{.*}}does-not-exist.mlir': No such file or directory
// MISSING-NOT: Traceback

// DIR-NOT: Traceback
// DIR: autosp-opt: error: could not open input file '{{.*}}cli': Is a directory
// DIR-NOT: Traceback

// OUT-NOT: Traceback
// OUT: autosp-opt: error: could not write output file '{{.*}}out.mlir': No such file or directory
// OUT-NOT: Traceback

// USAGE: usage: autosp-opt
// USAGE: autosp-opt: error: unrecognized arguments: --no-such-flag
func.func @f() {
  return
}
