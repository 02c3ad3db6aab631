"""lit configuration for autosp's FileCheck tests (``lit -v lit_tests``).

Tools: ``autosp-opt`` from the bin directory of the running Python (a virtualenv's
console script) or else PATH; ``FileCheck`` is LLVM's when installed (PATH, then
``/usr/lib/llvm-*/bin``), otherwise the PyPI ``filecheck``; ``not`` is LLVM's or
``not.py`` here (lit's internal shell also has a builtin ``not``; the substitution
keeps LLVM's semantics). ``%python`` is the running interpreter. Set
``AUTOSP_LIT_NO_LLVM=1`` to test with the PyPI ``filecheck`` and ``not.py``.
"""
import glob
import os
import shutil
import sys

import lit.formats

config.name = "autosp"
config.test_format = lit.formats.ShTest(execute_external=False)  # lit's internal shell
config.suffixes = [".mlir"]
config.test_source_root = os.path.dirname(os.path.abspath(__file__))
config.test_exec_root = config.test_source_root
config.excludes = ["lit.cfg.py", "not.py", "Output", "inputs", "README.md"]

bin_dir = os.path.dirname(sys.executable)
config.environment["PATH"] = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])
for var in ("HOME", "TMPDIR", "AUTOSP_DEBUG"):
    if var in os.environ:
        config.environment[var] = os.environ[var]


def _find(names, extra_globs=()):
    for name in names:
        path = shutil.which(name, path=config.environment["PATH"])
        if path:
            return path
    for pattern in extra_globs:
        hits = sorted(glob.glob(pattern), reverse=True)  # newest LLVM first
        if hits:
            return hits[0]
    return None


def _quote(path):
    return f'"{path}"' if " " in path else path


autosp_opt = _find(["autosp-opt"])
if autosp_opt is None:
    lit_config.fatal("autosp-opt not found: run `pip install -e .` in the virtualenv")

# AUTOSP_LIT_NO_LLVM=1 forces the fallbacks (PyPI filecheck, not.py) to test them.
no_llvm = bool(os.environ.get("AUTOSP_LIT_NO_LLVM"))
llvm_filecheck = _find(["FileCheck", "FileCheck-22", "FileCheck-21", "FileCheck-20", "FileCheck-19", "FileCheck-18"],
                       ["/usr/lib/llvm-*/bin/FileCheck"])
if no_llvm or llvm_filecheck is None:
    filecheck = _find(["filecheck"])
    if filecheck is None:
        lit_config.fatal("no FileCheck: install LLVM's FileCheck or `pip install filecheck`")
    config.available_features.add("python-filecheck")
else:
    filecheck = llvm_filecheck
not_tool = None if no_llvm else _find(["not"], ["/usr/lib/llvm-*/bin/not"])
not_cmd = _quote(not_tool) if not_tool else "{} {}".format(_quote(sys.executable),
                                                       _quote(os.path.join(config.test_source_root, "not.py")))

lit_config.note(f"autosp-opt: {autosp_opt}; FileCheck: {filecheck}; not: {not_cmd}")
config.substitutions.append(("%python", _quote(sys.executable)))
config.substitutions.append((r"\bautosp-opt\b", _quote(autosp_opt)))
config.substitutions.append((r"\bFileCheck\b", _quote(filecheck) + " --enable-var-scope"))
# `not` as a command word (line start, after `|`, `;`, `&&`), not inside paths or options.
config.substitutions.append((r"(?<![\w./=-])not(?=\s)", not_cmd.replace("\\", "\\\\")))
