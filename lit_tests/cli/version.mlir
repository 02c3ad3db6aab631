// RUN: autosp-opt --version | FileCheck %s
// CHECK: autosp-opt {{[0-9]+\.[0-9]+[^ ]*}} (torch-mlir {{[^,]+}}, torch {{[0-9]+\.[0-9]+.*}})
